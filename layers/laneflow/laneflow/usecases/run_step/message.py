"""The user message a step's attempt is sent: its instruction, the handoff, the output
hint, and the truthful header of a resumed or retried attempt."""

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
from laneflow.ports import Services
from laneflow.usecases.run_step.handoff import handoff_for


@dataclass(frozen=True)
class EarlierAttempt:
    """How an earlier attempt of this step ended, as the next attempt is told it."""

    n: int
    status: AttemptStatus
    reason: str
    kind: FailureKind | None = None

    @classmethod
    def of(cls, attempt: Attempt) -> EarlierAttempt:
        return cls(n=attempt.n, status=attempt.status, reason=attempt.reason or "", kind=attempt.reason_kind)

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
