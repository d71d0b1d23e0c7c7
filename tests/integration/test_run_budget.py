"""The run's `budget:` inside a group: once the run's spend reaches it, no step starts and no
running step begins another model turn; what had not started is skipped "budget spent", a
step refused its next turn fails "budget spent", and the run fails "budget spent". Through
the real definition on the embedded engine, on both stores (the run's spend is the store's:
each attempt adds its cost to the run's as it ends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, drive, error_of, write_workspace

from laneflow.domain.records import RunStatus, StepStatus
from laneflow.domain.settlement import BUDGET_SPENT
from laneflow.ports import Services

FIVE = ["a", "b", "c", "d", "e"]


def fan_out(tmp_path: Path, *, parallel: int = 1, then: bool = False) -> Path:
    steps: list[dict[str, Any]] = [{"agent": "pricey", "each": FIVE, "parallel": parallel}]
    if then:
        steps.append({"agent": "writer"})
    return write_workspace(
        tmp_path / "ws",
        {"pricey": {"stub": "cost: 0.03\nPricey {item}."}, "writer": {"stub": "Written."}},
        {"spend": {"budget": 0.05, "steps": steps}},
    )


def test_a_group_stops_starting_steps_once_the_run_has_spent_its_budget(on: ServicesOn, tmp_path: Path) -> None:
    # Given five steps of $0.03 in one group, one at a time, and a budget of $0.05
    svc = on()
    run = drive(svc, fan_out(tmp_path), "spend")
    # Then the two that started before the budget was reached ran, and nothing after them
    assert [s.status for s in run.steps] == [StepStatus.completed] * 2 + [StepStatus.skipped] * 3
    assert [(s.skip_reason, s.attempts) for s in run.steps[2:]] == [(BUDGET_SPENT, 0)] * 3
    assert run.cost_usd == pytest.approx(0.06)
    assert run.status == RunStatus.failed and run.error == "budget spent: $0.0600 of $0.05"


def test_the_group_after_a_group_that_spent_the_budget_in_its_middle_does_not_start(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run = drive(svc, fan_out(tmp_path, then=True), "spend")
    assert [s.status for s in run.steps][2:] == [StepStatus.skipped] * 4
    assert {s.skip_reason for s in run.steps[2:]} == {BUDGET_SPENT}
    assert run.status == RunStatus.failed and error_of(run).startswith(BUDGET_SPENT) and run.cost_usd == pytest.approx(0.06)


def test_a_running_step_begins_no_model_turn_once_the_run_has_spent_its_budget(on: ServicesOn, tmp_path: Path) -> None:
    # Given one step whose turns cost $0.03 each after the first, and a budget of $0.05
    turns = "Looking.\n===\ncost: 0.03\nStill looking.\n===\ncost: 0.03\nNearly.\n===\ncost: 0.03\nDone."
    ws = write_workspace(
        tmp_path / "ws",
        {"talker": {"stub": turns}, "writer": {"stub": "Written."}},
        {"long": {"budget": 0.05, "steps": [{"agent": "talker"}, {"agent": "writer"}]}},
    )
    svc = on()
    run = drive(svc, ws, "long")
    talker = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    # Then it ran three turns ($0, $0.03, $0.03) and was refused the fourth: failed, not retried
    assert [c.cost_usd for c in talker.calls] == [0.0, 0.03, 0.03]
    assert talker.status == StepStatus.failed and talker.attempts == 1
    assert error_of(talker).startswith("budget spent: $0.0600 of $0.05") and "model turn 4" in error_of(talker)
    assert talker.cost_usd == pytest.approx(0.06)
    # And the run ended for the budget's reason, its next group never started
    assert run.status == RunStatus.failed and run.error == "budget spent: $0.0600 of $0.05"
    assert (run.steps[1].status, run.steps[1].skip_reason) == (StepStatus.skipped, BUDGET_SPENT)
    assert run.cost_usd == pytest.approx(0.06)


def test_a_run_within_its_budget_is_untouched_by_it(svc: Services, tmp_path: Path) -> None:
    ws = write_workspace(
        tmp_path / "ws",
        {"pricey": {"stub": "One.\n===\ncost: 0.01\nTwo."}},
        {"cheap": {"budget": 0.05, "steps": [{"agent": "pricey", "each": ["a", "b", "c"], "parallel": 1}]}},
    )
    run = drive(svc, ws, "cheap")
    assert run.status == RunStatus.completed and run.error is None and run.cost_usd == pytest.approx(0.03)
