"""Drive decisions, unit-tested without any engine: lanes, group outcomes, run endings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import error_of

from laneflow.adapters.workers import local_worker
from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.messages import DriveRef, EndRunRequest, NextGroupRequest, SettleGroupRequest, StartDriveRequest
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import Attempt, AttemptStatus, FailureKind, Run, RunStatus, Step, StepChanges, StepStatus
from laneflow.ports import Services
from laneflow.usecases.end_run import end_run
from laneflow.usecases.next_group import next_group
from laneflow.usecases.run_step.message import EarlierAttempt, earlier_attempts, user_message
from laneflow.usecases.settle_group import settle_group
from laneflow.usecases.start_drive import start_drive
from laneflow.usecases.start_run import create_run

SEM = Path(__file__).resolve().parents[1] / "fixtures" / "ws_semantics"


def flow_of(*entries: list[StepSpec]) -> Flow:
    return Flow(name="f", path="flows/f.yaml", entries=[Entry(index=i, kind="steps", steps=e) for i, e in enumerate(entries)])


def step(index: int, agent: str, model: str = "stub", entry: int = 0, slot: int = 0) -> Step:
    return Step(index=index, group=0, entry=entry, slot=slot, agent=agent, model=model)


def test_lanes_are_keyed_by_agent_and_model_in_index_order() -> None:
    flow = flow_of([StepSpec(agent="a"), StepSpec(agent="b")])
    steps = [step(0, "a"), step(1, "b", slot=1), step(2, "a", model="claude-x"), step(3, "a")]
    lanes = plan_lanes(steps, flow, 100)
    assert [(lane.agent, lane.model, [s.index for s in lane.steps]) for lane in lanes] == [
        ("a", "stub", [0, 3]),
        ("b", "stub", [1]),
        ("a", "claude-x", [2]),
    ]


def test_lane_concurrency_is_the_tightest_parallel_and_never_above_the_engine_cap() -> None:
    flow = flow_of([StepSpec(agent="a", parallel=4)], [StepSpec(agent="b")])
    assert plan_lanes([step(i, "a") for i in range(10)], flow, 100)[0].parallel == 4
    assert plan_lanes([step(i, "b", entry=1) for i in range(10)], flow, 6)[0].parallel == 6
    assert plan_lanes([step(0, "b", entry=1)], flow, 100)[0].parallel == 1


def test_with_the_gate_a_lane_has_one_lead_then_siblings_and_a_lone_step_has_no_gate() -> None:
    flow = flow_of([StepSpec(agent="a"), StepSpec(agent="b")])
    lanes = plan_lanes([step(0, "a"), step(1, "a"), step(2, "a"), step(3, "b", slot=1)], flow, 100, gate=True)
    assert [s.role for s in lanes[0].steps] == ["lead", "sibling", "sibling"]
    assert [s.role for s in lanes[1].steps] == ["solo"]
    assert all(s.role == "solo" for s in plan_lanes([step(0, "a"), step(1, "a")], flow, 100)[0].steps)


@pytest.fixture
def started(svc: Services) -> tuple[Run, DriveRef]:
    run = create_run(svc, SEM, "optional_fails")
    ref = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id, execution="exec-1"), worker=local_worker())
    return run, ref


def test_start_drive_sets_running_driven_at_and_counts_drives(svc: Services, started: tuple[Run, DriveRef]) -> None:
    run, ref = started
    stored = svc.store.get_run(run.tenant, run.id, steps=False)
    assert stored.status == RunStatus.running and stored.driven_at and stored.drives == 1 and ref.drive == 1
    again = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id), worker=local_worker())
    assert again.drive == 2
    assert svc.store.get_run(run.tenant, run.id, steps=False).driven_at == stored.driven_at


def test_next_group_plans_the_first_group_with_pending_steps_then_ends(svc: Services, started: tuple[Run, DriveRef]) -> None:
    run, ref = started
    plan = next_group(svc, NextGroupRequest(run=ref))
    assert plan.action == "run" and plan.group == 0 and {lane.agent for lane in plan.lanes} == {"optional_failer", "scout"}
    for s in svc.store.get_steps(run.tenant, run.id):
        svc.store.update_step(run.tenant, run.id, s.index, StepChanges(status=StepStatus.completed))
    assert next_group(svc, NextGroupRequest(run=ref)).action == "end"


def test_settle_fails_the_run_for_a_required_failure_only(svc: Services, started: tuple[Run, DriveRef]) -> None:
    run, ref = started
    t, r = run.tenant, run.id
    svc.store.update_step(t, r, 0, StepChanges(status=StepStatus.failed, error="optional broke"))  # optional
    svc.store.update_step(t, r, 1, StepChanges(status=StepStatus.completed))
    assert settle_group(svc, SettleGroupRequest(run=ref, group=0)).action == "next"
    svc.store.update_step(t, r, 1, StepChanges(status=StepStatus.failed, error="scout broke"))
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0))
    assert settled.action == "end" and settled.reason is not None and "step 1 (scout) failed: scout broke" in settled.reason
    ended = end_run(svc, EndRunRequest(run=ref))
    assert ended.status == RunStatus.failed
    stored = svc.store.get_run(t, r, steps=False)
    assert stored.finished_at and stored.error == settled.reason


def test_settle_marks_a_step_nothing_ran_as_failed_so_none_stays_pending(svc: Services, started: tuple[Run, DriveRef]) -> None:
    run, ref = started
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.completed))
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0))
    step = svc.store.get_step(run.tenant, run.id, 1)
    assert step.status == StepStatus.failed and "NotRun" in error_of(step) and settled.action == "end"


def test_settle_reads_its_group_again_after_tidying_wrote_to_it_and_decides_on_what_it_wrote(
    svc: Services, started: tuple[Run, DriveRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ref = started
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.completed))
    reads, get_steps = [], svc.store.get_steps

    def counted(tenant: str, run_id: str, *, group: int | None = None, messages: bool = True, where: Any = None) -> Any:
        assert not messages, "a decision reads no step's message"
        assert where == StepFilter(settling=True), "a flow without until: is settled on what can fail it"
        reads.append(group)
        return get_steps(tenant, run_id, group=group, messages=messages, where=where)

    monkeypatch.setattr(svc.store, "get_steps", counted)
    settled = settle_group(svc, SettleGroupRequest(run=ref, group=0))  # step 1 never ran: tidying fails it
    assert reads == [0, 0]
    assert settled.action == "end" and "step 1 (scout) failed" in (settled.reason or "")


def test_end_run_completes_a_run_with_every_step_done_and_leaves_an_ended_run_alone(
    svc: Services, started: tuple[Run, DriveRef]
) -> None:
    run, ref = started
    for s in svc.store.get_steps(run.tenant, run.id):
        svc.store.update_step(run.tenant, run.id, s.index, StepChanges(status=StepStatus.completed))
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed
    first = svc.store.get_run(run.tenant, run.id, steps=False).finished_at
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed
    assert svc.store.get_run(run.tenant, run.id, steps=False).finished_at == first


def test_end_run_of_a_run_whose_steps_all_ended_reads_no_step_and_settles_its_cost_from_the_outline(
    svc: Services, started: tuple[Run, DriveRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ref = started
    steps = svc.store.get_steps(run.tenant, run.id)
    for s in steps:
        svc.store.update_step(
            run.tenant, run.id, s.index, StepChanges(status=StepStatus.completed, cost_usd=0.125 * (s.index + 1))
        )
    read = []
    monkeypatch.setattr(svc.store, "get_steps", lambda *a, **k: read.append(a) or [])  # type: ignore[func-returns-value]
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed
    spent = round(sum(0.125 * (s.index + 1) for s in steps), 6)
    assert read == [] and svc.store.get_run(run.tenant, run.id, steps=False).cost_usd == spent > 0


def test_end_run_fails_a_run_with_a_flow_step_still_running_and_skips_those_not_started(
    svc: Services, started: tuple[Run, DriveRef]
) -> None:
    run, ref = started
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t", started_at="2026-01-01T00:00:00.000Z")
    ended = end_run(svc, EndRunRequest(run=ref))
    assert ended.status == RunStatus.failed
    stored = svc.store.get_run(run.tenant, run.id)
    assert stored.error == "the drive ended with steps not run"
    assert [s.status for s in stored.steps] == [StepStatus.running] + [StepStatus.skipped] * (len(stored.steps) - 1)


def test_end_run_of_a_run_with_a_step_awaiting_approval_and_no_error_completes_skipping_it(
    svc: Services, started: tuple[Run, DriveRef]
) -> None:
    run, ref = started
    steps = svc.store.get_steps(run.tenant, run.id)
    for s in steps[1:]:
        svc.store.update_step(run.tenant, run.id, s.index, StepChanges(status=StepStatus.completed))
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.awaiting_approval))
    assert end_run(svc, EndRunRequest(run=ref)).status == RunStatus.completed  # awaiting approval is not "not run"
    assert svc.store.get_step(run.tenant, run.id, 0).status == StepStatus.skipped


def _told(*earlier: EarlierAttempt) -> str:
    spec = StepSpec(agent="a", output="json", schema={"type": "object"})  # type: ignore[call-arg]
    return user_message(Step(index=0, group=0, agent="a", instruction="Do it."), spec, "", list(earlier))


def test_a_retry_after_its_own_invalid_output_is_told_to_fix_it_not_that_it_was_not_its_choice() -> None:
    schema = "the output does not match its schema: title: 5 is not of type 'string'"
    text = _told(EarlierAttempt(n=1, status=AttemptStatus.failed, reason=schema, kind=FailureKind.output))
    assert text.startswith("Do it.") and "JSON Schema" in text
    [line] = [line for line in text.splitlines() if line.startswith("- attempt 1")]
    assert line == f"- attempt 1 replied, but its own output was refused: {schema}. Fix that in this attempt."
    assert "not by your own choice" not in text and "not by its own choice" not in text
    assert "part of the work" in text


def test_an_interrupted_attempt_and_a_model_error_are_told_not_by_its_own_choice() -> None:
    text = _told(
        EarlierAttempt(n=1, status=AttemptStatus.interrupted, reason="interrupted: its worker went away"),
        EarlierAttempt(n=2, status=AttemptStatus.failed, reason="the model was overloaded", kind=FailureKind.model),
        EarlierAttempt(n=3, status=AttemptStatus.failed, reason="its budget of $0.10 is spent", kind=FailureKind.other),
    )
    lines = [line for line in text.splitlines() if line.startswith("- attempt")]
    assert lines == [
        "- attempt 1 was interrupted: its worker went away, not by its own choice.",
        "- attempt 2 ended with a model or network error, not by its own choice: the model was overloaded.",
        "- attempt 3 failed: its budget of $0.10 is spent.",
    ]
    assert "may already have done part of the work" in text


def test_earlier_attempts_are_those_of_this_pass_only_a_new_loop_cycle_is_told_nothing() -> None:
    def attempt(n: int, started: Any, status: Any, kind: Any = None) -> Attempt:
        return Attempt(run_id="r", index=0, n=n, token="t", started_at=started, status=status, reason="why", reason_kind=kind)

    attempts = [
        attempt(1, "2026-01-01T00:00:01.000Z", AttemptStatus.failed, FailureKind.output),  # the last cycle's
        attempt(2, "2026-01-01T00:00:02.000Z", AttemptStatus.completed),
        attempt(3, "2026-01-01T00:00:05.000Z", AttemptStatus.interrupted),  # this cycle's
    ]
    assert earlier_attempts(attempts, since=None) == []  # reset by a loop: its first attempt of this cycle
    told = earlier_attempts(attempts, since="2026-01-01T00:00:05.000Z")
    assert [(a.n, a.status) for a in told] == [(3, AttemptStatus.interrupted)]


def test_a_gated_lane_s_siblings_map_runs_the_lane_s_whole_cap() -> None:
    # The reserve (laneflow.domain.gate), not a smaller Map, keeps lead + siblings within it.
    flow = flow_of([StepSpec(agent="a", parallel=3)])
    [lane] = plan_lanes([step(i, "a") for i in range(6)], flow, 100, gate=True)
    assert (lane.starters, lane.starter_role, lane.siblings) == ([0], "lead", [1, 2, 3, 4, 5])
    assert (lane.parallel, lane.sibling_parallel) == (3, 3)


def test_a_lane_capped_at_one_at_a_time_has_no_gate() -> None:
    flow = flow_of([StepSpec(agent="a", parallel=1)])
    [lane] = plan_lanes([step(i, "a") for i in range(3)], flow, 100, gate=True)
    assert (lane.starters, lane.starter_role, lane.siblings) == ([0, 1, 2], "solo", [])


def test_settle_reads_its_group_and_the_run_s_outline_never_every_step_and_settles_its_cost_from_that(
    svc: Services, started: tuple[Run, DriveRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ref = started
    t, r = run.tenant, run.id
    svc.store.update_step(t, r, 0, StepChanges(status=StepStatus.completed, cost_usd=0.25))
    svc.store.update_step(t, r, 1, StepChanges(status=StepStatus.completed, cost_usd=0.5))
    reads: list[int | str | None] = []
    get_steps, outline = svc.store.get_steps, svc.store.get_group_outline

    def counted(tenant: str, run_id: str, *, group: int | None = None, messages: bool = True, where: Any = None) -> Any:
        assert not messages, "a decision reads no step's message"
        assert where == StepFilter(settling=True), "a flow without until: is settled on what can fail it"
        reads.append(group)
        return get_steps(tenant, run_id, group=group, messages=messages, where=where)

    def outlined(tenant: str, run_id: str) -> Any:
        reads.append("outline")
        return outline(tenant, run_id)

    monkeypatch.setattr(svc.store, "get_steps", counted)
    monkeypatch.setattr(svc.store, "get_group_outline", outlined)
    assert settle_group(svc, SettleGroupRequest(run=ref, group=0)).action == "next"
    assert reads == [0, "outline"]  # the group's steps (nothing to tidy: read once) and the outline
    assert svc.store.get_run(t, r, steps=False).cost_usd == 0.75
    reads.clear()
    svc.store.request_stop(t, r)
    svc.store.update_step(t, r, 1, StepChanges(cost_usd=1.0))
    assert settle_group(svc, SettleGroupRequest(run=ref, group=0)).action == "end"
    assert reads == ["outline"] and svc.store.get_run(t, r, steps=False).cost_usd == 1.25  # a stopped run's cost still settles
