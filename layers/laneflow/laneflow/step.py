"""Running one step: claim an attempt, build the prompt, execute, record — fenced throughout.

Every write after the claim names the attempt (`AttemptRef`); a write the store refuses
means the attempt was ended by someone else (a stop, an interruption), and the runner stops
writing. A failure after the claim and before the executor starts (an unreadable agent) ends
the attempt with its reason, so no step is left `running` with nothing working on it.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import re
import secrets as _secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema

from . import jsonsafe, observability
from .capture import STEP_CAPTURE_LIMIT, Redactor
from .contracts import RunStepRequest, StepReport
from .errors import AttemptEnded, Conflict, InvalidInput, LaneflowError, StepFailed, StepStopped
from .executors.base import StepJob, StepOutcome
from .flow import Flow, StepSpec
from .crash import crashpoint
from .gate import open_gate
from .models import Attempt, AttemptRef, AttemptStatus, Event, FailureKind, ModelCall, Run, Step, StepStatus, utcnow
from .prompt import build_system_prompt
from .runs import run_account
from .services import Services
from .workers import current_worker, dumps
from .workspace import load_agent, load_workspace
from .workspaces import WorkingCopy, checkout

log = logging.getLogger("laneflow.step")

HEARTBEAT_S = 60.0
FLUSH_S = 30.0
_ABS_PATH = re.compile(r"(?<![\w.:/~-])(?:/[\w.@+-]+){2,}/?")


def scrub_paths(text: str, *roots: str) -> str:
    """A reason as it may be recorded: no local filesystem paths (DESIGN section 7)."""
    for root in sorted((r for r in roots if r), key=len, reverse=True):
        text = text.replace(root.rstrip("/") + "/", "").replace(root, "<workspace>")
    return _ABS_PATH.sub("<path>", text)


def step_spec(run: Run, step: Step) -> StepSpec:
    return Flow.model_validate(run.flow_spec).spec(step.entry, step.slot)


# -- what the model is told ------------------------------------------------------------------


def build_handoff(svc: Services, run: Run, group: int, kind: str) -> str:
    """The handoff block for the steps of `group`: the previous group's completed results
    (rescue records never count: a rescued step carries its rescue's result). Approval
    groups are passed over."""
    if kind == "none":
        return ""
    previous: list[Step] = []
    group -= 1
    while group >= 0:
        previous = [s for s in svc.store.get_steps(run.tenant, run.id, group=group) if s.rescue_of is None]
        if any(s.agent for s in previous):
            break
        group -= 1
    parts = []
    for s in previous:
        if s.status != StepStatus.completed or not s.agent:
            continue
        item = "" if s.item is None else f" — {s.item if isinstance(s.item, str) else json.dumps(s.item, ensure_ascii=False)}"
        if kind == "conclusions":
            body = s.conclusion or ""
        elif kind == "data":
            body = json.dumps(s.data, ensure_ascii=False, indent=2)
        else:
            body = s.result or ""
        parts.append(f"### {s.agent}{item} (step {s.index})\n{body.strip()}")
    if not parts:
        return ""
    return "## Handoff from the previous group\n\n" + "\n\n".join(parts)


def handoff_key(group: int, cycle: int, kind: str) -> str:
    return f"g{group}c{cycle}:{kind}"


def feedback_key(group: int, cycle: int) -> str:
    """Where a loop keeps what its checking step said, for the group the new cycle starts at."""
    return f"feedback:g{group}c{cycle}"


def prepare_handoffs(svc: Services, run: Run, group: int, cycle: int, kinds: set[str]) -> None:
    """Build each handoff block a launching group needs once, for all of its steps (a
    fan-out of N would otherwise read the previous group N times)."""
    for kind in sorted(kinds - {"none"}):
        svc.store.put_handoff(run.tenant, run.id, handoff_key(group, cycle, kind), build_handoff(svc, run, group, kind))


def handoff_for(svc: Services, run: Run, step: Step, kind: str, *, group: int, cycle: int) -> str:
    """The block the planner prepared for this step's group (else built now), and, in a new
    loop cycle, what the checking step said about the last one (whatever the handoff kind)."""
    block = ""
    if kind != "none":
        prepared = svc.store.get_handoff(run.tenant, run.id, handoff_key(group, cycle, kind))
        block = prepared if prepared is not None else build_handoff(svc, run, step.group, kind)
    feedback = svc.store.get_handoff(run.tenant, run.id, feedback_key(group, cycle)) if cycle else None
    return "\n\n".join(part for part in (block, feedback) if part)


@dataclass(frozen=True)
class EarlierAttempt:
    """How an earlier attempt of this step ended, as the next attempt is told it."""

    n: int
    status: AttemptStatus
    reason: str
    kind: FailureKind | None = None

    @classmethod
    def of(cls, attempt: Attempt) -> "EarlierAttempt":
        return cls(n=attempt.n, status=attempt.status, reason=attempt.reason or "", kind=attempt.reason_kind)

    def told(self) -> str:
        """One line of the retry header: the truth about this attempt, in the step's terms."""
        if self.status == AttemptStatus.interrupted:
            return f"attempt {self.n} was interrupted: its worker went away, not by its own choice"
        if self.kind == FailureKind.output:
            return f"attempt {self.n} replied, but its own output was refused: {self.reason}. Fix that in this attempt"
        if self.kind == FailureKind.model:
            return f"attempt {self.n} ended with a model or network error, not by its own choice: {self.reason}"
        if self.kind == FailureKind.worker:
            return f"attempt {self.n} ended when its worker failed, not by its own choice: {self.reason}"
        return f"attempt {self.n} failed: {self.reason}"


def earlier_attempts(attempts: list[Attempt], *, since: str | None) -> list[EarlierAttempt]:
    """The attempts of this pass of the step that failed or were interrupted. A pass begins
    with the attempt that set the step's `started_at` (`since`; None before its first
    attempt, and again after a loop reset, so a new cycle is not told the last one's tries);
    later attempts have higher numbers, whatever the clocks of the hosts that ran them."""
    if since is None:
        return []
    first = min((a.n for a in attempts if a.started_at == since), default=None)
    ended = (AttemptStatus.failed, AttemptStatus.interrupted)
    return [
        EarlierAttempt.of(a)
        for a in attempts
        if a.status in ended and (a.n >= first if first is not None else a.started_at >= since)
    ]


def user_message(step: Step, spec: StepSpec, handoff: str, history: list[EarlierAttempt]) -> str:
    """The user message an attempt is sent: its instruction, the handoff, what its output
    must be, and, when it was tried before, why each earlier attempt did not finish."""
    parts = [step.instruction.strip() or f"Do your part of the flow as {step.agent}."]
    if handoff:
        parts.append(handoff)
    if spec.output == "json":
        hint = "End your reply with the result as JSON in a ```json fenced block."
        if spec.schema_:
            hint += " It must match this JSON Schema:\n" + json.dumps(spec.schema_, indent=2)
        parts.append(hint)
    if history:
        told = "\n".join(f"- {earlier.told()}." for earlier in history)
        parts.append(
            "This step was tried before:\n"
            f"{told}\nThose attempts may already have done part of the work: check what is there "
            "before you redo it."
        )
    return "\n\n".join(parts)


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON of a reply: its last fenced block, else the whole text."""
    blocks = _FENCE.findall(text)
    candidate = blocks[-1] if blocks else text
    try:
        return jsonsafe.parse(candidate)  # strictly: a NaN kept in `data` would break the store's reads
    except json.JSONDecodeError as exc:
        raise StepFailed(
            f"the output is not valid JSON ({exc.msg} at line {exc.lineno})", retryable=True, kind=FailureKind.output
        ) from None
    except jsonsafe.Refusal as exc:
        raise StepFailed(f"the output is JSON laneflow cannot keep ({exc})", retryable=True, kind=FailureKind.output) from None


def check_output(spec: StepSpec, outcome: StepOutcome) -> Any:
    """`output: json`: the parsed data, validated against `schema:` when there is one."""
    if spec.output != "json":
        return None
    data = extract_json(outcome.conclusion or outcome.result)
    if spec.schema_:
        validator = jsonschema.validators.validator_for(spec.schema_)(spec.schema_)
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            listed = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10])
            raise StepFailed(f"the output does not match its schema: {listed}", retryable=True, kind=FailureKind.output)
    return data


@dataclass(frozen=True)
class Briefing:
    """What a step's next attempt is told: its handoff, the earlier attempts of this pass
    and the user message made of them (with the step's flow settings)."""

    spec: StepSpec
    handoff: str
    history: tuple[EarlierAttempt, ...]
    message: str


def brief(svc: Services, run: Run, step: Step, *, cycle: int) -> Briefing:
    """The briefing of a pending step's next attempt, read before it is claimed."""
    spec = step_spec(run, step)
    history = earlier_attempts(svc.store.list_attempts(run.tenant, run.id, step.index), since=step.started_at)
    handoff = handoff_for(svc, run, step, spec.handoff, group=step.group, cycle=cycle)
    return Briefing(spec=spec, handoff=handoff, history=tuple(history), message=user_message(step, spec, handoff, history))


# -- the sink ----------------------------------------------------------------------------------


@dataclass
class StepRecorder:
    """The `ExecutionSink` of one attempt: every write fenced by the attempt's identity."""

    svc: Services
    ref: AttemptRef
    base_n: int
    redact: Redactor
    capture: bool = True
    on_first_event: Any = None
    cost_usd: float = 0.0
    began: bool = False
    _numbers: dict[str, int] = field(default_factory=dict)
    _costs: dict[str, float] = field(default_factory=dict)
    _captured: int = 0
    _capture_full_noted: bool = False
    _stop_checked: float = 0.0
    _stopped: bool = False
    _beat: float = field(default_factory=time.monotonic)
    _flushed: float = field(default_factory=time.monotonic)
    spans: dict[str, ModelCall] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def first_event(self) -> None:
        with self._lock:
            if self.began:
                return
            self.began = True
        crashpoint("mid-model-call")
        if self.on_first_event:
            self.on_first_event()

    def call(self, span: ModelCall) -> ModelCall:
        """Spans are kept here and written with the attempt's end (one write); a long attempt
        writes them as it goes, at most every FLUSH_S, so a running step shows its turns."""
        with self._lock:
            n = self._numbers.setdefault(span.id, self.base_n + len(self._numbers) + 1)
            self.cost_usd += span.cost_usd - self._costs.get(span.id, 0.0)
            self._costs[span.id] = span.cost_usd
            span = span.model_copy(update={"n": n, "attempt": self.ref.n if self.ref.n > 1 else None})
            self.spans[span.id] = span
            due = time.monotonic() - self._flushed > FLUSH_S
            if due:
                self._flushed = time.monotonic()
        if due:
            self.svc.store.put_call(self.ref, span)
        return span

    def event(self, type: str, text: str, data: dict[str, Any] | None = None) -> None:
        # Masked by the store, like every write.
        self.svc.store.add_event(self.ref.tenant, self.ref.run_id, self.ref.index, Event(type=type, text=text, data=data), attempt=self.ref)

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0) -> None:
        # Masked first, so the sizes recorded are those of what the capture keeps.
        tool_input, tool_output = self.redact(tool_input), self.redact(tool_output)
        data: dict[str, Any] = {"tool": name, "input_chars": len(tool_input), "output_chars": len(tool_output), "ms": ms}
        size = len(tool_input) + len(tool_output)
        if self.capture and self._captured + size <= STEP_CAPTURE_LIMIT:
            self._captured += size
            key = f"s{self.ref.index}-a{self.ref.n}-{_secrets.token_hex(4)}"
            data["capture"] = self.svc.captures.put(
                self.ref.tenant, self.ref.run_id, key, {"tool": name, "input": tool_input, "output": tool_output, "at": utcnow()}
            )
        elif self.capture and not self._capture_full_noted:
            self._capture_full_noted = True
            self.event("warning", f"capture limit of {STEP_CAPTURE_LIMIT:,} characters reached: later tool calls keep names, sizes and times only")
        shown = tool_input if len(tool_input) <= 200 else tool_input[:200] + "…"
        self.event("tool", f"{name} {shown}".strip(), data)

    def stopped(self) -> bool:
        if self.svc.leaving.is_set():
            return True  # this worker is going away: end the call now (the attempt is interrupted, not stopped)
        now = time.monotonic()
        if not self._stopped and now - self._stop_checked > 0.5:
            self._stop_checked = now
            run = self.svc.store.get_run(self.ref.tenant, self.ref.run_id, steps=False)
            self._stopped = run.stop_requested
            if now - self._beat > HEARTBEAT_S:
                self._beat = now
                self.svc.store.heartbeat(self.ref, utcnow())  # AttemptEnded: someone ended it
        return self._stopped


# -- the attempt loop ---------------------------------------------------------------------------


class StepRunner:
    """Runs a claimed step through its attempts: retries what was not its own fault, up to
    `retries:` more attempts, telling each new attempt why the earlier ones failed."""

    def __init__(
        self,
        svc: Services,
        run: Run,
        step: Step,
        attempt: Attempt,
        *,
        briefing: "Briefing",
        cycle: int = 0,
        open_gate: Callable[[str], int] | None = None,
    ):
        self.svc, self.run, self.step, self.attempt, self.cycle = svc, run, step, attempt, cycle
        self.open_gate = open_gate  # set for a lane's lead: releases its waiting siblings
        self.prepared: tuple[Any, Any, Any, WorkingCopy] | None = None  # (workspace, agent, prompt, copy) of the first attempt
        self.copy: WorkingCopy | None = None  # the folder the current attempt works in
        self.recorder: StepRecorder | None = None  # the current attempt's sink (what it spent)
        self.spec, self.handoff = briefing.spec, briefing.handoff
        # What earlier attempts of this pass ended with (a retry, or a resume after a crash):
        # each new attempt is told the truth about why it runs again.
        self.history = list(briefing.history)
        self.message = briefing.message  # what the current attempt is sent (written with its claim)
        # `retries:` counts failures; an interruption (the worker went away) is not one.
        self.failures = sum(1 for a in self.history if a.status == AttemptStatus.failed)

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef.of(self.run.tenant, self.attempt)

    def _note(self, type: str, text: str, data: dict[str, Any] | None = None) -> None:
        self.svc.store.add_event(self.run.tenant, self.run.id, self.step.index, Event(type=type, text=text, data=data), attempt=self.ref)

    def run_attempts(self) -> StepReport:
        try:
            return self._run_attempts()
        finally:
            self._metrics()

    def _metrics(self) -> None:
        if not observability.IN_LAMBDA:  # metrics are off locally: no read for them
            return
        step = self.svc.store.get_step(self.run.tenant, self.run.id, self.step.index, detail=True)
        started = step.started_at and _dt.datetime.fromisoformat(step.started_at.replace("Z", "+00:00"))
        waited = [e for e in step.events if e.type == "gate" and "waiting" in e.text]
        gate_wait = None
        if waited and started:
            gate_wait = (started - _dt.datetime.fromisoformat(waited[0].t.replace("Z", "+00:00"))).total_seconds() * 1000
        spent = sum(c.ms for c in step.calls)
        observability.step_metrics(cost_usd=step.cost_usd, duration_ms=spent, calls=step.calls, gate_wait_ms=gate_wait)

    def _run_attempts(self) -> StepReport:
        store = self.svc.store
        while True:
            self.recorder = None
            observability.bind(attempt=self.attempt.n)
            try:
                if self.history:  # the first attempt's start is its record; a later one says why it runs
                    told = {"told": [a.reason for a in self.history], "kinds": [a.kind or a.status for a in self.history]}
                    self._note("attempt", f"attempt {self.attempt.n} started on model {self.step.model}", told)
                outcome, data, recorder = self._attempt()
            except AttemptEnded:
                return self._report()
            except StepFailed as failure:
                reason, retryable, kind = failure.reason, failure.retryable, failure.kind
                stopped = isinstance(failure, StepStopped)
            except InvalidInput as error:  # an agent that cannot be read: say where (file, line)
                reason, retryable, stopped, kind = error.one_line(), False, False, FailureKind.other
            except LaneflowError as error:
                reason, retryable, stopped, kind = str(error).splitlines()[0], False, False, FailureKind.other
            except Exception as error:  # a bug or an unexpected library error: end the attempt, say what
                if self.svc.leaving.is_set():
                    return self._interrupted()
                log.exception("step %s of %s: attempt %s crashed", self.step.index, self.run.id, self.attempt.n)
                reason, retryable, stopped, kind = f"{type(error).__name__}: {error}", False, False, FailureKind.other
            else:
                cost = recorder.cost_usd
                try:
                    store.end_attempt(
                        self.ref,
                        AttemptStatus.completed,
                        step={
                            "status": StepStatus.completed,
                            "result": outcome.result,
                            "conclusion": outcome.conclusion,
                            "data": data,
                            "error": None,
                            "cost_usd": round(self.step.cost_usd + cost, 6),
                            "finished_at": utcnow(),
                        },
                        calls=list(recorder.spans.values()),
                    )
                except AttemptEnded:
                    pass
                crashpoint("after-result")
                return self._report()
            finally:
                self._discard()  # however the attempt ended, its copy of the workspace goes

            if self.svc.leaving.is_set():
                # The attempt ended because its worker is going away (Ctrl-C): not its doing.
                return self._interrupted()
            # Masked here too (the store masks what it writes): the next attempt's message is
            # built from it in memory and must read as it would after a resume.
            reason = self.svc.redactor(scrub_paths(reason, self.run.workspace_uri))
            cost = self.recorder.cost_usd if self.recorder else 0.0  # what the failed attempt spent counts
            self.step.cost_usd = round(self.step.cost_usd + cost, 6)
            retry = retryable and self.failures < self.spec.retries
            try:
                self._note("error", f"attempt {self.attempt.n} failed: {reason}")
                changes: dict[str, Any] = {"error": reason, "cost_usd": self.step.cost_usd}
                if not retry:
                    changes.update(status=StepStatus.failed, finished_at=utcnow())
                ended = AttemptStatus.stopped if stopped else AttemptStatus.failed
                spans = list(self.recorder.spans.values()) if self.recorder else []
                store.end_attempt(
                    self.ref, ended, reason=reason, step=changes, calls=spans, reason_kind=None if stopped else kind
                )
            except AttemptEnded:
                return self._report()
            if not retry:
                return self._report()
            if self.open_gate:
                # Siblings do not wait through the lead's retries: they start and write the prefix themselves.
                self.open_gate(f"the lead's attempt {self.attempt.n} failed before its reply began")
            self.history.append(EarlierAttempt(n=self.attempt.n, status=AttemptStatus.failed, reason=reason, kind=kind))
            self.failures += 1
            self.message = user_message(self.step, self.spec, self.handoff, self.history)
            try:
                self.attempt = store.claim_attempt(
                    self.run.tenant,
                    self.run.id,
                    self.step.index,
                    token=_secrets.token_hex(16),
                    started_at=utcnow(),
                    expect_status=(StepStatus.running,),
                    worker=self.attempt.worker,
                    message=self.message,
                )
            except Conflict:
                return self._report()

    def _attempt(self) -> tuple[StepOutcome, Any, StepRecorder]:
        svc, run, step = self.svc, self.run, self.step
        if self.prepared is not None:  # built before the claim, layers written with it
            ws, agent, prompt, self.copy = self.prepared
            self.prepared = None
        else:
            ws, agent, prompt, self.copy = prepare(run, step)
            svc.store.set_prompt_layers(self.ref, prompt.records())
        prior = svc.store.get_step(run.tenant, run.id, step.index, detail=True)
        budget = None
        if agent.settings.budget is not None:
            budget = agent.settings.budget - self.step.cost_usd
            if budget <= 0:
                raise StepFailed(f"its budget of ${agent.settings.budget:.2f} is spent", retryable=False)
        self.recorder = recorder = StepRecorder(
            svc=svc,
            ref=self.ref,
            base_n=len(prior.calls),
            redact=svc.redactor,
            capture=ws.settings.capture == "full",
            on_first_event=(lambda: self.open_gate("the lead's reply began", at=utcnow())) if self.open_gate else None,
        )
        job = StepJob(
            tenant=run.tenant,
            run_id=run.id,
            index=step.index,
            attempt=self.attempt.n,
            agent=agent.name,
            model=step.model,
            item=step.item,
            run_input=run.input,
            system_stable=prompt.stable,
            system_dynamic=prompt.dynamic,
            user=self.message,
            tools=tuple(agent.settings.tools),
            workspace_root=str(ws.root),
            agent_path=agent.path,
            stub=agent.settings.stub,
            answer_index=self.attempt.n - 1,
            max_turns=agent.settings.max_turns,
            timeout=agent.settings.timeout,
            budget=budget,
        )
        crashpoint("rescue-running" if step.rescue_of is not None else "executor-started")
        outcome = svc.executor(step.model).execute(job, recorder)
        data = check_output(self.spec, outcome)
        if self.spec.verify_judge:
            self._judge(ws, job, outcome, recorder)
        self._keep(agent, recorder)
        return outcome, data, recorder

    def _keep(self, agent: Any, recorder: "StepRecorder") -> None:
        """The attempt completed: what it wrote that outlives it goes back to the workspace
        (the tenant's S3 prefix in the cloud), and only while this attempt is still the
        running one, so an attempt a stop or an interruption ended meanwhile keeps nothing."""
        kept = self.copy.changed(agent.path) if self.copy is not None else []
        if not kept:
            return
        self.svc.store.heartbeat(self.ref, utcnow())  # AttemptEnded if it was ended meanwhile
        try:
            self.copy.keep(kept)  # type: ignore[union-attr] - there is something to keep
        except Exception as error:  # noqa: BLE001 - S3 or disk: the attempt did not complete
            log.warning("step %s of %s: keeping its files failed: %s", self.step.index, self.run.id, error)
            raise StepFailed(f"what it wrote could not be kept in the workspace ({type(error).__name__})", retryable=True) from None
        recorder.event("info", f"kept in the workspace: {', '.join(kept)}", {"kept": kept})

    def _discard(self) -> None:
        """Remove the current attempt's working copy (a local workspace is left as it is)."""
        if self.copy is not None:
            self.copy.discard()
            self.copy = None

    def _judge(self, ws: Any, job: StepJob, outcome: StepOutcome, recorder: "StepRecorder") -> None:
        """`verify: judge:` asks the judge model (AGENTS.md `judge:`, workspace over account,
        field by field; the run's `--model` wins). A failing verdict fails the attempt with the
        judge's reason, and the next attempt is told it."""
        settings = ws.settings.judge or {}
        model = self.run.model or settings.get("model") or self.step.model
        question = self.spec.verify_judge or ""
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
            user=f"Question: {question}\n\nThe step was asked:\n{self.step.instruction}\n\nIts output:\n{outcome.result}",
            stub=settings.get("stub") or "PASS",
            answer_index=job.attempt - 1,
            timeout=job.timeout,
        )
        reply = self.svc.executor(model).execute(verdict_job, recorder)
        passed, reason = parse_verdict(reply.conclusion or reply.result)
        recorder.event("judge", f"judge ({model}): {'PASS' if passed else 'FAIL: ' + reason}")
        if not passed:
            raise StepFailed(f"the judge failed it: {reason}", retryable=True, kind=FailureKind.output)

    def _interrupted(self) -> StepReport:
        """Mark this attempt interrupted by its exact identity, the way reconcile does for a
        worker that went away: the next drive retries it and tells it why."""
        from .reconcile import interrupt  # reconcile builds on the drive, which builds on this module

        run = self.svc.store.get_run(self.run.tenant, self.run.id, steps=False)
        spent = self.recorder.cost_usd if self.recorder else 0.0  # what it spent counts, as for a failure
        calls = list(self.recorder.spans.values()) if self.recorder else []
        interrupt(self.svc, self.run.tenant, run, self.attempt, calls=calls, cost_usd=round(self.step.cost_usd + spent, 6))
        return self._report()

    def _report(self) -> StepReport:
        step = self.svc.store.get_step(self.run.tenant, self.run.id, self.step.index)
        return StepReport(index=step.index, status=step.status, attempts=step.attempts)


WAITED_TO_START = "run stopped by a person while this step waited to start"


def prepare(run: Run, step: Step) -> tuple[Any, Any, Any, WorkingCopy]:
    """Give the attempt its own working copy of the workspace (`checkout`), read the
    workspace (with the run's account) and the agent from it afresh and build the step's
    system prompt. The copy is the caller's to discard; if reading fails it is discarded here."""
    copy = checkout(run.workspace_uri)
    try:
        ws = load_workspace(copy.root, run_account(run))
        agent = load_agent(ws, step.agent or "")
        return ws, agent, build_system_prompt(ws, agent), copy
    except BaseException:
        copy.discard()
        raise
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


def run_step(svc: Services, req: RunStepRequest, worker: dict | None = None) -> StepReport:
    """Claim the step's next attempt and run it to its end. A step that already ended (a
    re-delivered invocation) or is claimed by another worker is reported, not run again; a
    step reached after a stop is skipped, never started. A lane's lead opens its gate when
    its reply begins, and on every way out without one."""
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    # Where the model's key is in Secrets Manager, this step runner reads it now, before the
    # step records anything, so every record is masked from its first line.
    svc.secret_values()
    opener = None
    if req.step.role == "lead":
        opener = functools.partial(
            open_gate, svc, tenant, run_id, group=req.group, cycle=req.cycle, lane=req.lane, lead=index
        )
    try:
        return _run_step(svc, req, opener, worker or current_worker())
    finally:
        if opener:
            opener(why="the lead ended without a reply")


def _run_step(svc: Services, req: RunStepRequest, opener: Callable[..., int] | None, worker: dict) -> StepReport:
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    run = svc.store.get_run(tenant, run_id, steps=False)
    step = svc.store.get_step(tenant, run_id, index)
    if step.status != StepStatus.pending:
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    if svc.leaving.is_set():  # this worker is going away: claim nothing; the next drive runs it
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    if run.stop_requested or run.status.ended:
        try:
            step = svc.store.update_step(
                tenant, run_id, index, {"status": StepStatus.skipped, "skip_reason": WAITED_TO_START}, expect_status=(StepStatus.pending,)
            )
        except Conflict:
            step = svc.store.get_step(tenant, run_id, index)
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    # Read the workspace and build the prompt before claiming, so its layers are written
    # with the claim. If that fails, the attempt is still claimed and then ended with the
    # reason (the runner meets the same failure): no step stays pending or running silently.
    try:
        prepared: tuple[Any, Any, Any, WorkingCopy] | None = prepare(run, step)
    except Exception:  # noqa: BLE001 - reported through the attempt below
        prepared = None
    try:
        return _claim_and_run(svc, req, run, step, prepared, opener, worker)
    finally:
        if prepared:
            prepared[3].discard()  # if no attempt took it (the claim went elsewhere, a crash)


def _claim_and_run(
    svc: Services, req: RunStepRequest, run: Run, step: Step, prepared: tuple[Any, Any, Any, WorkingCopy] | None,
    opener: Callable[..., int] | None, worker: dict,
) -> StepReport:
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    # What this attempt is sent is known before it is claimed (nothing in it depends on the
    # attempt's number), so the claim records it: the step's `message` costs no write.
    briefing = brief(svc, run, step, cycle=req.cycle)
    op_id = req.op.op_id(group=req.group, cycle=req.cycle, index=index)
    svc.store.journal_begin(tenant, run_id, op_id, index)
    crashpoint("after-journal")
    token = _secrets.token_hex(16)
    try:
        attempt = svc.store.claim_attempt(
            tenant, run_id, index, token=token, started_at=utcnow(), op_id=op_id, worker=dumps(worker),
            layers=prepared[2].records() if prepared else None, message=briefing.message,
        )
    except Conflict:
        step = svc.store.get_step(tenant, run_id, index)
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    if attempt.token != token:
        # A re-delivered invocation: the journal gave back what the first one claimed. That
        # attempt is its worker's, not ours: report, never run it twice.
        step = svc.store.get_step(tenant, run_id, index)
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    crashpoint("after-claim")
    running = step.model_copy(update={"status": StepStatus.running})
    lead_opener = (lambda why, at=None: opener(why=why, at=at)) if opener else None
    runner = StepRunner(svc, run, running, attempt, briefing=briefing, cycle=req.cycle, open_gate=lead_opener)
    runner.prepared = prepared
    return runner.run_attempts()
