"""The user message a step's attempt is sent: its instruction, the handoff, the output
hint, and the truthful header of a resumed, retried or redriven attempt."""

from __future__ import annotations

import json
from dataclasses import dataclass

from laneflow.domain.flow import StepSpec, step_spec
from laneflow.domain.records import (
    Attempt,
    AttemptStatus,
    FailureKind,
    Run,
    Step,
)
from laneflow.domain.redrive import StepRedrive
from laneflow.ports import Services
from laneflow.usecases.run_step.handoff import handoff_for


@dataclass(frozen=True)
class EarlierAttempt:
    """How an earlier attempt of this step ended, as the next attempt is told it."""

    n: int
    status: AttemptStatus
    reason: str
    kind: FailureKind | None = None
    before_redrive: bool = False  # it ended before the run was redriven: told, not counted against `retries:`

    @classmethod
    def of(cls, attempt: Attempt, *, redriven_after: int | None = None) -> EarlierAttempt:
        before = redriven_after is not None and attempt.n <= redriven_after
        return cls(
            n=attempt.n, status=attempt.status, reason=attempt.reason or "", kind=attempt.reason_kind, before_redrive=before
        )

    @property
    def counts(self) -> bool:
        """Whether it spends one of the step's `retries:`: a failure of this pass, since the
        latest redrive (a redrive gives the step its retries anew), that was not a memory kill
        (its next attempt runs one size up, at most twice: sizes.py). An interruption (the
        worker went away) is not one."""
        return self.status == AttemptStatus.failed and self.kind != FailureKind.memory and not self.before_redrive

    def told(self) -> str:
        """One line of the retry header: the truth about this attempt, in the step's terms."""
        if self.kind == FailureKind.memory:
            return f"attempt {self.n} was killed for memory or evicted, not by its own choice (this one runs a size up): {self.reason}"
        if self.status == AttemptStatus.interrupted:
            return f"attempt {self.n} was interrupted: its worker went away, not by its own choice"
        if self.kind == FailureKind.output:
            return f"attempt {self.n} replied, but its own output was refused: {self.reason}. Fix that in this attempt"
        if self.kind == FailureKind.model:
            return f"attempt {self.n} ended with a model or network error, not by its own choice: {self.reason}"
        if self.kind == FailureKind.worker:
            return f"attempt {self.n} ended when its worker failed, not by its own choice: {self.reason}"
        return f"attempt {self.n} failed: {self.reason}"


def earlier_attempts(attempts: list[Attempt], *, since: str | None, redriven_after: int | None = None) -> list[EarlierAttempt]:
    """The attempts of this pass of the step that failed or were interrupted. A pass begins
    with the attempt that set the step's `started_at` (`since`; None before its first
    attempt, and again after a loop reset, so a new cycle is not told the last one's tries);
    later attempts have higher numbers, whatever the clocks of the hosts that ran them. A
    redrive does not begin a pass: the attempts up to `redriven_after` are told as well,
    marked as before it."""
    if since is None:
        return []
    first = min((a.n for a in attempts if a.started_at == since), default=None)
    ended = (AttemptStatus.failed, AttemptStatus.interrupted)
    return [
        EarlierAttempt.of(a, redriven_after=redriven_after)
        for a in attempts
        if a.status in ended and (a.n >= first if first is not None else a.started_at >= since)
    ]


def user_message(
    step: Step, spec: StepSpec, handoff: str, history: list[EarlierAttempt], *, redrive: StepRedrive | None = None
) -> str:
    """The user message an attempt is sent: its instruction, the handoff, what its output
    must be, that the run was redriven (and why it had failed) when it runs in a redrive,
    and, when it was tried before, why each earlier attempt did not finish."""
    parts = [step.instruction.strip() or f"Do your part of the flow as {step.agent}."]
    if handoff:
        parts.append(handoff)
    if spec.output == "json":
        hint = "End your reply with the result as JSON in a ```json fenced block."
        if spec.schema_:
            hint += " It must match this JSON Schema:\n" + json.dumps(spec.schema_, indent=2)
        parts.append(hint)
    if redrive is not None:
        parts.append(redrive.told())
    if history:
        told = "\n".join(f"- {earlier.told()}." for earlier in history)
        parts.append(
            "This step was tried before:\n"
            f"{told}\nThose attempts may already have done part of the work: check what is there "
            "before you redo it."
        )
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Briefing:
    """What a step's next attempt is told: its handoff, the earlier attempts of this pass
    and the user message made of them (with the step's flow settings)."""

    spec: StepSpec
    handoff: str
    history: tuple[EarlierAttempt, ...]
    message: str
    redrive: StepRedrive | None = None  # the redrive it runs in, if it runs again in one


def brief(svc: Services, run: Run, step: Step, *, cycle: int) -> Briefing:
    """The briefing of a pending step's next attempt, read before it is claimed."""
    spec = step_spec(run, step)
    redrive = step_redrive(svc, run, step)
    history = earlier_attempts(
        svc.store.list_attempts(run.tenant, run.id, step.index),
        since=step.started_at,
        redriven_after=redrive.attempts if redrive else None,
    )
    handoff = handoff_for(svc, run, step, spec.handoff, group=step.group, cycle=cycle)
    message = user_message(step, spec, handoff, history, redrive=redrive)
    return Briefing(spec=spec, handoff=handoff, history=tuple(history), message=message, redrive=redrive)


def step_redrive(svc: Services, run: Run, step: Step) -> StepRedrive | None:
    """The redrive this step runs again in: the latest its trace records, while the step is
    in the cycle it was redriven in (a loop's later cycle is a pass of its own). Its trace is
    read only in a run that was redriven."""
    if not run.redrives:
        return None
    events = svc.store.get_step(run.tenant, run.id, step.index, detail=True).events
    found = StepRedrive.latest(events)
    return found if found is not None and found.cycle == step.cycle else None
