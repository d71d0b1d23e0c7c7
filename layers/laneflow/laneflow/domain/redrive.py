"""The rules of a redrive (`laneflow redrive RUN`, `POST /runs/{id}/redrive`): which runs a
person may redrive and why not, which steps go back to pending, and what a step that runs
again in a redrive is told. The use case (`usecases/redrive.py`) writes what they say.

A run that failed goes on from where it failed: its failed and skipped flow steps go back to
pending and get a new attempt (numbered after the old ones, which stay in the record), its
completed steps are kept as they are. A stopped run is not redriven (a stop is one-way, and
`stop_requested` is never cleared), nor a run whose budget is spent (its next drive would end
before any step starts). A rescue record is not a flow step: a failed one is superseded, so a
redriven step that fails again gets its `on_fail` rescue anew.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from laneflow.domain.records import Event, EventType, Run, RunStatus, Step, StepStatus
from laneflow.domain.settlement import STOPPED, budget_spent

# run.options: the latest redrive, {"n", "at", "error", "drives"}: its number, when, the error
# the run had failed with, and the drives the run had had before it.
REDRIVEN = "redriven"

# A failed rescue record, when the step it took over is redriven.
SUPERSEDED_BY_REDRIVE = "superseded by a redrive"

# The trace line's `data` key that marks a step's redrive (`StepRedrive.event`).
_MARK = "redrive"


def refusal(run: Run) -> str | None:
    """Why `run` may not be redriven now (None: it may)."""
    if run.stop_requested or (run.error or "").startswith(STOPPED):
        return (
            f"run {run.id} was stopped by a person: a stopped run is not redriven (a stop is one-way);"
            " start a new run of its flow"
        )
    if run.status == RunStatus.completed:
        return f"run {run.id} completed: there is nothing to redrive"
    if run.status == RunStatus.awaiting_approval:
        return f"run {run.id} is waiting for a person (an approval), not failed: answer it instead"
    if run.status != RunStatus.failed:
        return f"run {run.id} is {run.status}: it has not failed, so there is nothing to redrive"
    spent = budget_spent(run)
    if spent:
        return (
            f"run {run.id} cannot be redriven: its budget is spent ({spent}), so its next drive would end"
            " before any step starts; start a new run (a run keeps the budget it started with)"
        )
    return None


@dataclass(frozen=True)
class RedrivePlan:
    """What a redrive writes to the run's steps: the flow steps that go back to pending, the
    failed rescue records it supersedes, and the steps still running (which refuse it)."""

    reset: tuple[Step, ...]
    superseded: tuple[Step, ...]
    running: tuple[Step, ...]


def plan(steps: Iterable[Step]) -> RedrivePlan:
    """The plan of a redrive of a run with these steps."""
    reset, superseded, running = [], [], []
    for step in steps:
        if step.status == StepStatus.running:
            running.append(step)
        elif step.rescue_of is not None:
            if step.status == StepStatus.failed:
                superseded.append(step)
        elif step.status in (StepStatus.failed, StepStatus.skipped):
            reset.append(step)
    return RedrivePlan(reset=tuple(reset), superseded=tuple(superseded), running=tuple(running))


def drives_since_redrive(run: Run) -> int:
    """The run's drives since its latest redrive (all of them, never redriven): what the limit
    on drives (LANEFLOW_MAX_DRIVES) counts, so a redriven run gets as many as a new one."""
    latest = run.options.get(REDRIVEN)
    before = latest.get("drives", 0) if isinstance(latest, dict) else 0
    return run.drives - before if isinstance(before, int) and 0 <= before <= run.drives else run.drives


@dataclass(frozen=True)
class StepRedrive:
    """A step's redrive, as its trace keeps it: which redrive, the error the run had failed
    with, the attempts the step had had before it and the cycle it was in."""

    n: int
    error: str
    attempts: int
    cycle: int

    def event(self) -> Event:
        """The trace line the redrive leaves on the step."""
        data: dict[str, Any] = {_MARK: self.n, "error": self.error, "attempts": self.attempts, "cycle": self.cycle}
        return Event(type=EventType.info, text=f"redriven (redrive {self.n}) after the run failed: {self.error}", data=data)

    @classmethod
    def latest(cls, events: Iterable[Event]) -> StepRedrive | None:
        """The latest redrive a step's trace records, if any."""
        found = None
        for event in events:
            data = event.data or {}
            try:
                found = cls(
                    n=int(data[_MARK]), error=str(data["error"]), attempts=int(data["attempts"]), cycle=int(data["cycle"])
                )
            except (KeyError, TypeError, ValueError):
                continue
        return found

    def told(self) -> str:
        """What a step that runs again in this redrive is told, before its earlier attempts."""
        which = f" (its redrive {self.n})" if self.n > 1 else ""
        return (
            f"This run was redriven after it failed: {self.error.rstrip('.')}{which}. "
            "The steps that had completed were kept; this step runs in the redrive."
        )
