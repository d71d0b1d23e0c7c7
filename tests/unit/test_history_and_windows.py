"""History costs counted from the definition, and the windows NextGroup plans within an
execution's history budget (no engine: the domain rules and the use cases on a store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from laneflow.adapters.workers import local_worker
from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.history import COSTS_FILE, costs_from_definition, history_costs, segment_name, state_events
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.messages import DriveRef, Lane, LaneStep, NextGroupRequest, SettleGroupRequest, StartDriveRequest
from laneflow.domain.records import Run, RunChanges, RunStatus, Step, StepChanges, StepStatus
from laneflow.domain.windows import most_steps, plan_window, rescue_window, window_cost
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.next_group import next_group
from laneflow.usecases.settle_group import settle_group
from laneflow.usecases.start_drive import start_drive
from laneflow.usecases.start_run import create_run

DEFINITION = ROOT / "statemachines" / "flow.asl.json"


def test_the_committed_history_costs_are_what_the_definition_gives() -> None:
    assert json.loads(COSTS_FILE.read_text()) == costs_from_definition(json.loads(DEFINITION.read_text())), (
        "out of date: run `python -m laneflow.domain.history statemachines/flow.asl.json`"
    )


def test_a_state_records_what_its_type_records() -> None:
    assert state_events({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke"}) == 5
    assert state_events({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken"}) == 6
    assert state_events({"Type": "Task", "Resource": "arn:aws:states:::states:startExecution.sync:2"}) == 6
    assert state_events({"Type": "Choice"}) == state_events({"Type": "Pass"}) == 2
    assert state_events({"Type": "Map"}) == state_events({"Type": "Parallel"}) == 4


def test_the_costs_match_what_the_engine_recorded_for_a_gated_lane_of_five() -> None:
    # measured with get_execution_history: a run of one gated lane of five stub steps, 114
    # events (a stub lead passes StarterWaits but not WaitForPrefix: the stub keeps no registry)
    costs = history_costs()
    assert costs.drive + costs.group + costs.lane + costs.of_step("solo") + 4 * costs.of_step("sibling") == 114
    assert costs.of_step("sibling") == 13 and costs.of_step("solo") == 9 and costs.of_step("lead") == 15


def test_a_definition_missing_a_state_the_costs_name_is_refused() -> None:
    definition = json.loads(DEFINITION.read_text())
    del definition["States"]["NextDrive"]
    with pytest.raises(ValueError, match="no state NextDrive"):
        costs_from_definition(definition)


def test_segment_names_are_derived_and_fit_step_functions() -> None:
    assert segment_name("run-1", 2, 3) == "run-1-d2s3"
    assert len(segment_name("r" * 100, 12, 345)) == 80 and segment_name("r" * 100, 12, 345).endswith("-d12s345")


def _window(planned: tuple[list[Lane], int] | None) -> tuple[list[Lane], int]:
    assert planned is not None  # a window, where the test expects one (None: continue)
    return planned


def _steps(n: int, agent: str = "a") -> list[Step]:
    return [Step(index=i, group=0, agent=agent, model="stub", item=str(i)) for i in range(n)]


def _flow() -> Flow:
    return Flow(name="f", path="flows/f.yaml", entries=[Entry(index=0, kind="steps", steps=[StepSpec(agent="a")])])


def test_a_window_takes_the_pending_steps_in_order_that_fit_and_a_later_one_has_no_lead() -> None:
    costs, steps, flow = history_costs(), _steps(40), _flow()

    def plan(window: list[Step]) -> list[Lane]:
        return plan_lanes(window, flow, 100, gate=True, group=steps)

    lanes, through = _window(plan_window(steps, plan, used=0, budget=300, costs=costs, fresh=True))
    assert through >= 0 and lanes[0].starters == [0] and lanes[0].starter_role == "lead"
    assert costs.drive + window_cost(lanes, costs) <= 300
    assert costs.drive + window_cost(plan(steps[: through + 2]), costs) > 300  # one more would not fit
    rest = [s for s in steps if s.index > through]
    [later], _ = _window(plan_window(rest, plan, used=0, budget=300, costs=costs, fresh=True))
    assert later.starters == [] and later.siblings[0] == through + 1  # siblings only: the lead ran already
    assert plan_window(rest, plan, used=250, budget=300, costs=costs, fresh=False) is None  # continue
    [one], at = _window(plan_window(rest, plan, used=0, budget=60, costs=costs, fresh=True))  # too small: one step anyway
    assert one.siblings == [through + 1] and at == through + 1


def test_rescues_run_as_many_as_fit_and_a_fresh_execution_takes_one_at_least() -> None:
    costs = history_costs()
    rescues = [LaneStep(index=i) for i in range(50)]
    taken, used = rescue_window(rescues, used=0, budget=200, costs=costs, fresh=True)
    assert 0 < len(taken) < 50 and used + costs.drive <= 200
    assert rescue_window(rescues, used=190, budget=200, costs=costs, fresh=False) == ([], 190)
    assert len(rescue_window(rescues, used=0, budget=10, costs=costs, fresh=True)[0]) == 1


@pytest.fixture
def big(svc: Services, tmp_path: Path) -> tuple[Run, DriveRef]:
    ws = tmp_path / "ws"
    (ws / "agents" / "a").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nx\n")
    (ws / "agents" / "a" / "agent.md").write_text("---\nstub: ok\n---\nx\n")
    (ws / "flows" / "f.yaml").write_text("steps:\n  - agent: a\n    each: input.items\n")
    svc.settings = Settings(history_budget=300)
    run = create_run(svc, ws, "f", {"items": [str(i) for i in range(40)]})
    ref = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id), worker=local_worker())
    return run, ref


def test_next_group_plans_a_window_and_settle_answers_next_until_its_last_window_ran(
    svc: Services, big: tuple[Run, DriveRef]
) -> None:
    run, ref = big
    plan = next_group(svc, NextGroupRequest(run=ref))
    assert plan.action == "run" and 0 <= plan.through < 39 and plan.used + history_costs().drive <= 300
    for index in range(plan.through + 1):
        svc.store.update_step(run.tenant, run.id, index, StepChanges(status=StepStatus.completed, result="ok"))
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0, through=plan.through, used=plan.used))
    assert settled.action == "next" and (settled.group, settled.through, settled.used) == (0, plan.through, plan.used)
    assert all(s.status == StepStatus.pending for s in svc.store.get_steps(run.tenant, run.id) if s.index > plan.through)
    assert next_group(svc, NextGroupRequest(run=ref, used=plan.used)).action == "continue"
    later = next_group(svc, NextGroupRequest(run=ref, used=0))
    assert later.action == "run" and later.lanes[0].siblings[0] == plan.through + 1


def test_a_windows_decisions_read_the_window_not_the_whole_group(
    svc: Services, big: tuple[Run, DriveRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NextGroup reads the window's pending steps (one more than fit) and each lane's first
    two; SettleGroup after a window that is not the group's last reads whether a later one
    is left and the window's unfinished steps; the last window's settlement the group's steps
    its decision can turn on, the rescues and the steps that did not complete, never the whole
    group (a fan-out of 10,000 in 8 windows read its 10,000 steps three times a window)."""
    run, ref = big
    read: list[int] = []
    get_steps = svc.store.get_steps

    def counted(*args: Any, **kwargs: Any) -> list[Step]:
        steps = get_steps(*args, **kwargs)
        read.append(len(steps))
        return steps

    monkeypatch.setattr(svc.store, "get_steps", counted)
    plan = next_group(svc, NextGroupRequest(run=ref))
    window = plan.through + 1
    assert plan.action == "run" and 0 < window < 40
    most = most_steps(used=0, budget=300, costs=history_costs())  # what the room pays for at the cheapest step's cost
    assert read == [most + 1, 2] and most + 1 < 40, read  # the candidates (one past what could fit), the lane's first two
    for index in range(window):
        svc.store.update_step(run.tenant, run.id, index, StepChanges(status=StepStatus.completed, result="ok"))
    svc.store.update_step(run.tenant, run.id, window - 1, StepChanges(status=StepStatus.running))  # nothing works on it
    read.clear()
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0, through=plan.through, used=plan.used))
    assert settled.action == "next" and settled.reason == f"{40 - window} step(s) of group 0 still to run"
    assert read == [1, 1], read  # a later step exists; the window's one step still marked running
    assert svc.store.get_step(run.tenant, run.id, window - 1).status == StepStatus.failed  # tidied: none stays running
    for index in range(window, 40):
        svc.store.update_step(run.tenant, run.id, index, StepChanges(status=StepStatus.completed, result="ok"))
    read.clear()
    last = settle_group(svc, SettleGroupRequest(run=ref, group=0, through=39, used=0))
    assert last.action == "end" and "failed" in (last.reason or "")  # the step nothing worked on failed, and it is required
    assert read == [0, 1], read  # no later window; the one step that did not complete, not the 39 that did


def test_a_failed_step_in_an_earlier_window_does_not_settle_the_group_before_its_last(
    svc: Services, big: tuple[Run, DriveRef]
) -> None:
    run, ref = big
    next_group(svc, NextGroupRequest(run=ref))
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.failed, error="boom"))
    assert next_group(svc, NextGroupRequest(run=ref)).action == "run"  # not "settle": the group is under way


def test_a_continuation_claims_no_drive_and_records_its_execution(svc: Services, big: tuple[Run, DriveRef]) -> None:
    run, ref = big
    assert ref.drive == 1
    svc.store.update_run(run.tenant, run.id, RunChanges(execution="first"))
    req = StartDriveRequest.model_validate(
        {
            "tenant": run.tenant,
            "run_id": run.id,
            "execution": "second",
            "input": {"tenant": run.tenant, "run_id": run.id, "drive": 1, "segment": 1},
        }
    )
    cont = start_drive(svc, req, worker=local_worker())
    assert (cont.drive, cont.segment) == (1, 1)
    stored = svc.store.get_run(run.tenant, run.id, steps=False)
    assert stored.drives == 1 and stored.execution == "second" and stored.status == RunStatus.running
    anew = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id, execution="third"), worker=local_worker())
    assert (anew.drive, anew.segment) == (2, 0)


@pytest.mark.slow  # making 100,000 steps takes seconds
def test_a_window_of_a_fan_out_of_100000_stays_far_under_the_state_limit() -> None:
    """NextGroup's output (the plan, its lanes as indexes) for a fan-out of 100,000 at the
    default budget: a window bounds every list, so it is kilobytes, not megabytes."""
    from laneflow.domain.messages import Plan

    costs, steps, flow = history_costs(), _steps(100_000), _flow()
    planned: list[int] = []  # the size of each window `plan` was asked for

    def plan(window: list[Step]) -> list[Lane]:
        planned.append(len(window))
        return plan_lanes(window, flow, 100, gate=True, group=steps[:2])

    lanes, through = _window(plan_window(steps, plan, used=0, budget=18_000, costs=costs, fresh=True))
    # Planning a window does not cost the whole group: a bisection of a few tries (17 halve
    # 100,000), none of them near the whole group's size
    assert len(planned) <= 17 and max(planned) < len(steps) // 10, planned
    out = Plan(action="run", group=0, lanes=lanes, through=through, used=window_cost(lanes, costs)).model_dump_json()
    assert 1_000 < through < 2_000 and costs.drive + window_cost(lanes, costs) <= 18_000
    assert len(out.encode()) < 20_000
