"""The rules of a redrive (laneflow.domain.redrive) and what a step that runs again in one is
told (usecases/run_step/message.py), without a store or an engine."""

from __future__ import annotations

import pytest

from laneflow.domain.flow import StepSpec
from laneflow.domain.records import Attempt, AttemptStatus, Event, FailureKind, Run, RunStatus, Step, StepStatus
from laneflow.domain.redrive import REDRIVEN, StepRedrive, drives_since_redrive, plan, refusal
from laneflow.domain.settlement import STOPPED
from laneflow.usecases.run_step.message import earlier_attempts, user_message


def run(**fields: object) -> Run:
    return Run.model_validate({"id": "run-1", "workspace": "w", "flow": "f", "status": RunStatus.failed, **fields})


def test_only_a_failed_run_not_stopped_and_within_its_budget_may_be_redriven() -> None:
    assert refusal(run(error="step 0 (a) failed: boom")) is None
    assert "completed: there is nothing to redrive" in str(refusal(run(status=RunStatus.completed)))
    for status in (RunStatus.queued, RunStatus.running):
        assert f"is {status}: it has not failed" in str(refusal(run(status=status)))
    assert "waiting for a person" in str(refusal(run(status=RunStatus.awaiting_approval)))
    # Stopped: by its flag, or by the reason it ended with.
    assert "was stopped by a person" in str(refusal(run(stop_requested=True)))
    assert "was stopped by a person" in str(refusal(run(error=STOPPED)))
    # Its budget: spent, or not yet.
    spent = refusal(run(cost_usd=0.05, options={"budget": 0.05}, error="budget spent: $0.0500 of $0.05"))
    assert spent is not None and "its budget is spent (budget spent: $0.0500 of $0.05)" in spent
    assert refusal(run(cost_usd=0.04, options={"budget": 0.05}, error="step 0 (a) failed: boom")) is None


def test_the_plan_resets_failed_and_skipped_flow_steps_and_supersedes_failed_rescues() -> None:
    steps = [
        Step(index=0, group=0, status=StepStatus.completed),
        Step(index=1, group=1, status=StepStatus.failed),
        Step(index=2, group=2, status=StepStatus.skipped),
        Step(index=3, group=1, status=StepStatus.failed, rescue_of=1),
        Step(index=4, group=1, status=StepStatus.skipped, rescue_of=1),
        Step(index=5, group=1, status=StepStatus.completed, rescue_of=1),
    ]
    redrive = plan(steps)
    assert [s.index for s in redrive.reset] == [1, 2]
    assert [s.index for s in redrive.superseded] == [3]
    assert redrive.running == ()
    assert [s.index for s in plan([Step(index=7, group=0, status=StepStatus.running)]).running] == [7]


def test_the_drive_limit_counts_the_drives_since_the_latest_redrive() -> None:
    assert drives_since_redrive(run(drives=4)) == 4
    assert drives_since_redrive(run(drives=6, options={REDRIVEN: {"n": 1, "drives": 5}})) == 1
    for damaged in ({"drives": "five"}, {"drives": 9}, {"drives": -1}, "x"):  # read as never redriven
        assert drives_since_redrive(run(drives=6, options={REDRIVEN: damaged})) == 6


def test_a_steps_latest_redrive_is_read_back_from_its_trace() -> None:
    first = StepRedrive(n=1, error="step 1 (w) failed: boom", attempts=1, cycle=0)
    second = StepRedrive(n=2, error="step 1 (w) failed: again", attempts=2, cycle=0)
    trace = [Event(text="attempt 1 failed: boom"), first.event(), Event(text="x", data={"redrive": "?"}), second.event()]
    assert StepRedrive.latest(trace) == second
    assert StepRedrive.latest([Event(text="attempt 1 failed: boom")]) is None
    assert second.told().startswith("This run was redriven after it failed: step 1 (w) failed: again (its redrive 2).")
    assert "(its redrive" not in first.told()


def attempt(n: int, status: AttemptStatus, kind: FailureKind | None = None) -> Attempt:
    return Attempt(
        run_id="run-1",
        index=1,
        n=n,
        token=f"t{n}",
        started_at=f"2026-01-01T00:00:0{n}.000Z",
        status=status,
        reason=f"why {n}",
        reason_kind=kind,
    )


def test_the_attempts_before_a_redrive_are_told_but_spend_none_of_the_steps_retries() -> None:
    attempts = [attempt(1, AttemptStatus.failed, FailureKind.model), attempt(2, AttemptStatus.failed, FailureKind.output)]
    attempts.append(attempt(3, AttemptStatus.failed, FailureKind.model))
    history = earlier_attempts(attempts, since=attempts[0].started_at, redriven_after=2)
    assert [(a.n, a.before_redrive, a.counts) for a in history] == [(1, True, False), (2, True, False), (3, False, True)]
    assert [a.counts for a in earlier_attempts(attempts, since=attempts[0].started_at)] == [True, True, True]


@pytest.mark.parametrize("history", [[], [attempt(1, AttemptStatus.failed, FailureKind.model)]])
def test_a_redriven_step_is_told_the_redrive_before_its_earlier_attempts(history: list[Attempt]) -> None:
    step = Step(index=1, group=1, agent="writer", instruction="Write the draft.")
    redrive = StepRedrive(n=1, error="step 1 (writer) failed: boom", attempts=len(history), cycle=0)
    told = user_message(
        step,
        StepSpec(agent="writer"),
        "",
        earlier_attempts(history, since=history[0].started_at) if history else [],
        redrive=redrive,
    )
    assert told.startswith("Write the draft.\n\nThis run was redriven after it failed: step 1 (writer) failed: boom.")
    assert ("This step was tried before:\n- attempt 1 ended with a model or network error" in told) == bool(history)
    assert "redriven" not in user_message(step, StepSpec(agent="writer"), "", [])
