"""Drive decisions, unit-tested without any engine: lanes, group outcomes, run endings."""

from __future__ import annotations

from pathlib import Path

import pytest

from laneflow.contracts import DriveRef, EndRunRequest, NextGroupRequest, SettleGroupRequest, StartDriveRequest
from laneflow.drive import end_run, next_group, plan_lanes, settle_group, start_drive
from laneflow.flow import Entry, Flow, StepSpec
from laneflow.models import RunStatus, Step, StepStatus
from laneflow.runs import create_run
from laneflow.step import user_message

SEM = Path(__file__).resolve().parents[1] / "fixtures" / "ws_semantics"


def flow_of(*entries: list[StepSpec]) -> Flow:
    return Flow(name="f", path="flows/f.yaml", entries=[Entry(index=i, kind="steps", steps=e) for i, e in enumerate(entries)])


def step(index, agent, model="stub", entry=0, slot=0) -> Step:
    return Step(index=index, group=0, entry=entry, slot=slot, agent=agent, model=model)


def test_lanes_are_keyed_by_agent_and_model_in_index_order():
    flow = flow_of([StepSpec(agent="a"), StepSpec(agent="b")])
    steps = [step(0, "a"), step(1, "b", slot=1), step(2, "a", model="claude-x"), step(3, "a")]
    lanes = plan_lanes(steps, flow, 100)
    assert [(l.agent, l.model, [s.index for s in l.steps]) for l in lanes] == [
        ("a", "stub", [0, 3]), ("b", "stub", [1]), ("a", "claude-x", [2])]


def test_lane_concurrency_is_the_tightest_parallel_and_never_above_the_engine_cap():
    flow = flow_of([StepSpec(agent="a", parallel=4)], [StepSpec(agent="b")])
    assert plan_lanes([step(i, "a") for i in range(10)], flow, 100)[0].parallel == 4
    assert plan_lanes([step(i, "b", entry=1) for i in range(10)], flow, 6)[0].parallel == 6
    assert plan_lanes([step(0, "b", entry=1)], flow, 100)[0].parallel == 1


def test_with_the_gate_a_lane_has_one_lead_then_siblings_and_a_lone_step_has_no_gate():
    flow = flow_of([StepSpec(agent="a"), StepSpec(agent="b")])
    lanes = plan_lanes([step(0, "a"), step(1, "a"), step(2, "a"), step(3, "b", slot=1)], flow, 100, gate=True)
    assert [s.role for s in lanes[0].steps] == ["lead", "sibling", "sibling"]
    assert [s.role for s in lanes[1].steps] == ["solo"]
    assert all(s.role == "solo" for s in plan_lanes([step(0, "a"), step(1, "a")], flow, 100)[0].steps)


@pytest.fixture
def started(svc):
    run = create_run(svc, SEM, "optional_fails")
    ref = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id, execution="exec-1"))
    return run, ref


def test_start_drive_sets_running_driven_at_and_counts_drives(svc, started):
    run, ref = started
    stored = svc.store.get_run(run.tenant, run.id, steps=False)
    assert stored.status == RunStatus.running and stored.driven_at and stored.drives == 1 and ref.drive == 1
    again = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id))
    assert again.drive == 2
    assert svc.store.get_run(run.tenant, run.id, steps=False).driven_at == stored.driven_at


def test_next_group_plans_the_first_group_with_pending_steps_then_ends(svc, started):
    run, ref = started
    plan = next_group(svc, NextGroupRequest(run=ref))
    assert plan.action == "run" and plan.group == 0 and {l.agent for l in plan.lanes} == {"optional_failer", "scout"}
    for s in svc.store.get_steps(run.tenant, run.id):
        svc.store.update_step(run.tenant, run.id, s.index, {"status": StepStatus.completed})
    assert next_group(svc, NextGroupRequest(run=ref)).action == "end"


def test_settle_fails_the_run_for_a_required_failure_only(svc, started):
    run, ref = started
    t, r = run.tenant, run.id
    svc.store.update_step(t, r, 0, {"status": StepStatus.failed, "error": "optional broke"})  # optional
    svc.store.update_step(t, r, 1, {"status": StepStatus.completed})
    assert settle_group(svc, SettleGroupRequest(run=ref, group=0)).action == "next"
    svc.store.update_step(t, r, 1, {"status": StepStatus.failed, "error": "scout broke"})
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0))
    assert settled.action == "end" and "step 1 (scout) failed: scout broke" in settled.reason
    ended = end_run(svc, EndRunRequest(run=ref))
    assert ended.status == RunStatus.failed
    stored = svc.store.get_run(t, r, steps=False)
    assert stored.finished_at and stored.error == settled.reason


def test_settle_marks_a_step_nothing_ran_as_failed_so_none_stays_pending(svc, started):
    run, ref = started
    svc.store.update_step(run.tenant, run.id, 0, {"status": StepStatus.completed})
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0))
    step = svc.store.get_step(run.tenant, run.id, 1)
    assert step.status == StepStatus.failed and "NotRun" in step.error and settled.action == "end"


def test_end_run_completes_a_run_with_every_step_done_and_leaves_an_ended_run_alone(svc, started):
    run, ref = started
    for s in svc.store.get_steps(run.tenant, run.id):
        svc.store.update_step(run.tenant, run.id, s.index, {"status": StepStatus.completed})
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed
    first = svc.store.get_run(run.tenant, run.id, steps=False).finished_at
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed
    assert svc.store.get_run(run.tenant, run.id, steps=False).finished_at == first


def test_a_retried_attempt_is_told_why_the_earlier_ones_failed():
    spec = StepSpec(agent="a", output="json", schema={"type": "object"})
    text = user_message(
        Step(index=0, group=0, agent="a", instruction="Do it."), spec, "",
        [(1, "the output does not match its schema: title: 5 is not of type 'string'"), (2, "interrupted: its worker went away")],
    )
    assert text.startswith("Do it.")
    assert "- attempt 1: the output does not match its schema: title: 5 is not of type 'string'" in text
    assert "- attempt 2: interrupted: its worker went away" in text and "part of the work" in text and "JSON Schema" in text


def test_a_gated_lane_runs_its_lead_plus_at_most_parallel_minus_one_siblings():
    flow = flow_of([StepSpec(agent="a", parallel=3)])
    [lane] = plan_lanes([step(i, "a") for i in range(6)], flow, 100, gate=True)
    assert [s.index for s in lane.starters] == [0] and [s.index for s in lane.siblings] == [1, 2, 3, 4, 5]
    assert (lane.parallel, lane.sibling_parallel) == (3, 2)


def test_a_lane_capped_at_one_at_a_time_has_no_gate():
    flow = flow_of([StepSpec(agent="a", parallel=1)])
    [lane] = plan_lanes([step(i, "a") for i in range(3)], flow, 100, gate=True)
    assert [s.role for s in lane.starters] == ["solo"] * 3 and lane.siblings == []
