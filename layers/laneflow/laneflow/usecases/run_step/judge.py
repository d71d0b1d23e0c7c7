"""`verify: judge:`: the judge's system prompt, how its verdict is read, and the asking."""

from __future__ import annotations

from laneflow.domain.errors import StepFailed
from laneflow.domain.records import EventType, FailureKind, Run, Step
from laneflow.domain.workspace import Workspace
from laneflow.ports import ExecutionSink, Services, StepJob, StepOutcome

JUDGE_SYSTEM = (
    "You are a strict judge of another agent's work. Answer the question about the output you are "
    "shown. Open your reply with PASS, or with FAIL: and the reason in one sentence."
)


def parse_verdict(text: str) -> tuple[bool, str]:
    """PASS, or FAIL: reason, on the first line that says anything; anything else fails."""
    first = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    head = first.lstrip("*#_ ").upper()
    if head.startswith("PASS"):
        return True, ""
    if head.startswith("FAIL"):
        reason = first.split(":", 1)[1].strip() if ":" in first else "no reason given"
        return False, reason or "no reason given"
    return False, f"the verdict was neither PASS nor FAIL: {first[:200]!r}"


def judge(
    svc: Services,
    run: Run,
    step: Step,
    ws: Workspace,
    job: StepJob,
    question: str | None,
    outcome: StepOutcome,
    recorder: ExecutionSink,
) -> None:
    """`verify: judge:` asks the judge model (AGENTS.md `judge:`, workspace over account,
    field by field; the run's `--model` wins). A failing verdict fails the attempt with the
    judge's reason, and the next attempt is told it."""
    settings = ws.settings.judge or {}
    model = run.model or settings.get("model") or step.model
    verdict_job = StepJob(
        tenant=job.tenant,
        run_id=job.run_id,
        index=job.index,
        attempt=job.attempt,
        agent="judge",
        model=model,
        item=job.item,
        run_input=job.run_input,
        system_stable=JUDGE_SYSTEM + (f" Think with {settings['effort']} effort." if settings.get("effort") else ""),
        system_dynamic="",
        user=f"Question: {question or ''}\n\nThe step was asked:\n{step.instruction}\n\nIts output:\n{outcome.result}",
        stub=settings.get("stub") or "PASS",
        answer_index=job.attempt - 1,
        timeout=job.timeout,
        effort=settings.get("effort") if isinstance(settings.get("effort"), str) else None,
    )
    reply = svc.executor(model).execute(verdict_job, recorder)
    passed, reason = parse_verdict(reply.conclusion or reply.result)
    recorder.event(EventType.judge, f"judge ({model}): {'PASS' if passed else 'FAIL: ' + reason}")
    if not passed:
        raise StepFailed(f"the judge failed it: {reason}", retryable=True, kind=FailureKind.output)
