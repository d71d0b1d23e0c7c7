"""Flow control (README, "Flow control"), each rule through the real definition on the engine:
rescues, evaluator loops, approvals, stop, budgets, the judge, and the run record."""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, FlowRunner, data_of, error_of, stamped

from laneflow.domain.records import AttemptStatus, Run, RunChanges, RunStatus, Step, StepChanges, StepStatus
from laneflow.domain.settlement import REJECTED, SUPERSEDED
from laneflow.ports import Services
from laneflow.usecases.approve import RunNotWaiting, answer_approval
from laneflow.usecases.run_step.handoff import feedback_key, handoff_for
from laneflow.usecases.run_step.runner import WAITED_TO_START
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import local_engine

CTRL = FIXTURES / "ws_control"


def rescues_of(run: Run, index: int) -> list[Step]:
    return [s for s in run.steps if s.rescue_of == index]


# -- rescue (on_fail) ------------------------------------------------------------------------


def test_a_failed_step_is_taken_over_by_its_rescue_and_carries_the_rescues_result(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "rescue").run
    assert run.status == RunStatus.completed, run.error
    writer = run.steps[2]
    [rescue] = rescues_of(run, 2)
    assert rescue.agent == "rescuer" and rescue.group == writer.group and rescue.status == StepStatus.completed
    assert writer.status == StepStatus.completed and writer.result == rescue.result == "Rescued draft. APPROVED"
    assert any("rescued by step" in e.text and "the writer crashed" in e.text for e in writer.events)
    assert rescue.instruction.startswith("Write the draft.") and "failed: the writer crashed" in rescue.instruction


def test_rescue_records_never_count_in_a_handoff_the_rescued_step_carries_it_once(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "rescue").run
    polish = run.steps[3]
    block = handoff_for(svc, run, polish, "results", group=polish.group, cycle=0)
    assert block.count("Rescued draft. APPROVED") == 1
    assert "(step 2)" in block and f"(step {rescues_of(run, 2)[0].index})" not in block


def test_a_rescue_is_never_launched_with_its_group(svc: Services, run_flow: FlowRunner) -> None:
    # The rescued step carries its rescue's finished_at, so the order is read from the attempts.
    run = run_flow(CTRL, "rescue").run
    writer, [rescue] = run.steps[2], rescues_of(run, 2)
    group = [s for s in run.steps if s.group == writer.group and s.rescue_of is None]
    ended = stamped(a.ended_at for s in group for a in svc.store.list_attempts(run.tenant, run.id, s.index))
    [failed] = svc.store.list_attempts(run.tenant, run.id, writer.index)
    assert failed.status == AttemptStatus.failed and all(ended)
    # The group's settlement makes the rescue, once every attempt of the group has ended ...
    [made] = [e for e in writer.events if e.text == f"rescue: rescuer takes this step over as step {rescue.index}"]
    assert made.t >= max(ended)
    # ... and only then does it start.
    started = [a.started_at for a in svc.store.list_attempts(run.tenant, run.id, rescue.index)]
    assert rescue.started_at is not None
    assert started and rescue.started_at > max(ended) and min(started) > max(ended)
    assert rescue.index > max(s.index for s in run.steps if s.rescue_of is None)


def test_a_rescues_own_failure_is_recorded_on_the_step_it_took_over_and_the_group_fails(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "rescue_fails").run
    assert run.status == RunStatus.failed
    failer = run.steps[0]
    [rescue] = rescues_of(run, 0)
    assert rescue.status == StepStatus.failed
    assert failer.status == StepStatus.failed and "its rescue (step 2, failing_rescuer) failed too" in error_of(failer)
    assert run.steps[1].status == StepStatus.skipped and run.steps[1].attempts == 0  # the next group never started
    assert "step 0 (failer) failed" in error_of(run)


def test_one_rescue_per_failure_across_drives_a_leftover_pending_rescue_is_picked_up(svc: Services, run_flow: FlowRunner) -> None:
    """A drive resumes a run whose earlier drive left two unfinished rescues of one failure:
    it runs the first, marks the other "superseded on resume", and adds none."""
    run = create_run(svc, CTRL, "rescue_fails")
    t, r = run.tenant, run.id
    svc.store.update_step(t, r, 0, StepChanges(status=StepStatus.failed, error="cannot write today", attempts=1))
    leftovers = [
        Step(index=2 + k, group=0, entry=0, slot=0, agent="rescuer", model="stub", rescue_of=0, instruction="Take over.")
        for k in range(2)
    ]
    svc.store.add_steps(t, r, leftovers)
    final = local_engine(svc).drive(t, r, tick_s=0.02).run
    rescues = rescues_of(final, 0)
    assert [s.index for s in rescues] == [2, 3]  # none added
    assert rescues[0].status == StepStatus.completed and rescues[0].agent == "rescuer"
    assert rescues[1].status == StepStatus.skipped and rescues[1].skip_reason == SUPERSEDED
    assert final.steps[0].status == StepStatus.completed and final.status == RunStatus.completed


def test_a_finished_rescue_is_history_a_later_failure_in_a_later_cycle_gets_a_new_one(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "loop_rescue").run
    assert run.status == RunStatus.completed, run.error
    rescues = rescues_of(run, 0)
    assert [(s.cycle, s.status) for s in rescues] == [(0, StepStatus.completed), (1, StepStatus.completed)]
    assert run.steps[0].attempts == 2 and run.steps[0].cycle == 1
    # rescue records are not reset by the loop: the first one kept its cycle-0 result
    [first_ended], [second_began] = stamped([rescues[0].finished_at]), stamped([rescues[1].started_at])
    assert rescues[0].result == "Rescued draft. APPROVED" and first_ended < second_began


def test_a_rescue_instruction_carries_the_marker_a_loop_step_owes(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "rescue_marker").run
    [rescue] = rescues_of(run, 1)
    assert "failed: the checker broke" in rescue.instruction and rescue.instruction.endswith("Your reply must end with APPROVED.")
    assert run.status == RunStatus.completed  # the rescue's reply ends with the marker


# -- evaluator loops ---------------------------------------------------------------------------


def test_a_loop_resets_from_the_named_agents_group_through_the_checker_and_approves_on_cycle_two(
    svc: Services, run_flow: FlowRunner
) -> None:
    run = run_flow(CTRL, "loop").run
    assert run.status == RunStatus.completed, run.error
    researchers, writer, checker = run.steps[:2], run.steps[2], run.steps[3]
    assert all(s.attempts == 1 and s.cycle == 0 for s in researchers)  # before the loop: not reset
    assert (writer.attempts, writer.cycle) == (2, 1) and (checker.attempts, checker.cycle) == (2, 1)
    assert checker.conclusion == "Looks good. APPROVED"
    feedback = svc.store.get_handoff(run.tenant, run.id, feedback_key(writer.group, 1))
    assert feedback is not None and "Needs work: too long." in feedback
    assert "Needs work: too long." in handoff_for(svc, run, writer, "results", group=writer.group, cycle=1)


def test_past_max_cycles_the_checking_step_fails(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "loop_exhausted").run
    assert run.status == RunStatus.failed
    writer, picky = run.steps
    assert writer.attempts == 2 and picky.attempts == 2
    assert picky.status == StepStatus.failed and picky.error == "its reply did not end with APPROVED after 2 cycle(s)"


# -- approvals ---------------------------------------------------------------------------------


def test_an_approval_parks_the_run_with_no_drive_left_running(run_flow: FlowRunner) -> None:
    result = run_flow(CTRL, "approval")
    run = result.run
    assert result.execution_status == "SUCCEEDED"  # the drive ended
    assert run.status == RunStatus.awaiting_approval and run.parked_at and run.execution is None
    writer, approval, poster = run.steps
    assert writer.status == StepStatus.completed
    assert approval.status == StepStatus.awaiting_approval and approval.agent is None
    assert poster.status == StepStatus.pending


def test_approving_continues_the_run_in_a_new_drive(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "approval").run
    answer_approval(svc, run.tenant, run.id, approve=True)
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert final.status == RunStatus.completed and final.drives == 2
    assert final.steps[1].status == StepStatus.completed and final.steps[2].data == {"title": "Tides", "words": 300}
    assert final.driven_at == run.driven_at  # set at the first pick-up only


def test_rejecting_fails_the_run_rejected_by_a_person(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "approval").run
    final = answer_approval(svc, run.tenant, run.id, approve=False)
    assert final.status == RunStatus.failed and final.error == REJECTED and final.finished_at
    steps = svc.store.get_steps(run.tenant, run.id)
    assert steps[1].status == StepStatus.failed and steps[2].status == StepStatus.skipped


def test_answering_a_run_that_is_not_waiting_is_a_clear_error(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "rescue").run
    with pytest.raises(RunNotWaiting, match="not waiting for an approval .it is completed"):
        answer_approval(svc, run.tenant, run.id, approve=True)


def test_the_revision_is_fixed_at_the_start_even_if_the_workspace_changes_while_parked(svc: Services, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(CTRL, ws)
    run = create_run(svc, ws, "approval")
    local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
    (ws / "agents" / "writer" / "agent.md").write_text("---\nstub: changed\n---\nChanged.\n")
    answer_approval(svc, run.tenant, run.id, approve=True)
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert final.revision == run.revision


# -- stop --------------------------------------------------------------------------------------


def _stop_when(svc: Services, run: Run, predicate: Callable[[Any], bool], timeout: float = 30.0) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(svc.store.get_run(run.tenant, run.id)):
                stop_run(svc, run.tenant, run.id)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_a_stop_ends_the_running_step_and_skips_what_had_not_started(svc: Services) -> None:
    run = create_run(svc, CTRL, "stop")
    watcher = _stop_when(svc, run, lambda r: r.steps[0].status == StepStatus.running)
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    watcher.join()
    assert final.status == RunStatus.failed and final.finished_at and final.error == "stopped by a person"
    slow, later = final.steps
    assert slow.status == StepStatus.failed and slow.error == "stopped by a person"
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    assert attempt.status == AttemptStatus.stopped and attempt.reason == "stopped by a person"
    # The stop cut the 40 s model call short: it never answered (no call span, no result)
    assert slow.calls == [] and slow.result is None
    assert later.status == StepStatus.skipped and later.skip_reason == "run stopped"


def test_steps_waiting_for_a_pool_slot_when_the_stop_came_are_skipped_never_started(svc: Services) -> None:
    run = create_run(svc, CTRL, "slots", options={"gate": False})
    watcher = _stop_when(svc, run, lambda r: r.steps[0].status == StepStatus.running)
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    watcher.join()
    first, *waiting = final.steps
    assert first.status == StepStatus.failed
    for step in waiting:
        assert step.status == StepStatus.skipped and step.skip_reason == WAITED_TO_START and step.attempts == 0


def test_a_second_stop_answers_already_and_a_stop_after_the_end_says_so(svc: Services, run_flow: FlowRunner) -> None:
    run = create_run(svc, CTRL, "approval")
    # a queued run has no drive: it is closed at once
    assert stop_run(svc, run.tenant, run.id).message == f"run {run.id} stopped"
    stopped = svc.store.get_run(run.tenant, run.id, steps=False)
    assert stopped.status == RunStatus.failed and stopped.stop_requested
    assert stop_run(svc, run.tenant, run.id).message == f"run {run.id} already stopped (failed)"
    finished = create_run(svc, CTRL, "rescue")
    local_engine(svc).drive(finished.tenant, finished.id, tick_s=0.02)
    assert stop_run(svc, finished.tenant, finished.id).message == f"run {finished.id} already ended (completed)"


def test_stopping_a_parked_run_closes_it_nothing_stays_parked(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "approval").run
    outcome = stop_run(svc, run.tenant, run.id)
    assert outcome.message == f"run {run.id} stopped"
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.failed and final.finished_at
    assert [s.status for s in final.steps] == [StepStatus.completed, StepStatus.skipped, StepStatus.skipped]
    assert all(s.skip_reason == "run stopped" for s in final.steps[1:])


def test_stop_is_one_way_under_concurrent_saves(svc: Services) -> None:
    """Interleaved writers save every field a save may name, while one thread stops: no
    interleaving clears stop_requested, and the run ends failed."""
    import random

    for seed in range(5):
        _race_a_stop(svc, random.Random(seed))


def _race_a_stop(svc: Services, rng: random.Random) -> None:
    run = create_run(svc, CTRL, "stop")
    t, r = run.tenant, run.id
    svc.store.update_run(t, r, RunChanges(status=RunStatus.running))
    barrier = threading.Barrier(9)

    def saver(k: int) -> None:
        barrier.wait()
        for _ in range(30):
            changes = rng.choice(
                [{"error": None}, {"driven_at": "2026-01-01T00:00:00.000Z"}, {"options": {"k": k}}, {"execution": f"e{k}"}]
            )
            svc.store.update_run(t, r, RunChanges.model_validate(changes))

    def stopper() -> None:
        barrier.wait()
        time.sleep(rng.random() / 100)
        stop_run(svc, t, r)

    threads = [threading.Thread(target=saver, args=(k,)) for k in range(8)] + [threading.Thread(target=stopper)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    final = svc.store.get_run(t, r, steps=False)
    assert final.stop_requested
    from laneflow.domain.messages import DriveRef, EndRunRequest
    from laneflow.usecases.end_run import end_run

    assert end_run(svc, EndRunRequest(run=DriveRef(tenant=t, run_id=r))).status == RunStatus.failed


# -- budgets -----------------------------------------------------------------------------------


def test_the_flow_budget_refuses_to_start_the_next_group_once_spent(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "budget").run
    assert run.status == RunStatus.failed and run.error == "budget spent: $0.0600 of $0.05"
    assert [s.status for s in run.steps] == [StepStatus.completed, StepStatus.completed, StepStatus.skipped]
    assert run.steps[2].skip_reason == "budget spent" and run.steps[2].attempts == 0


def test_an_agent_budget_stops_its_step_at_its_cap_and_is_not_retried(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "agent_budget").run
    step = run.steps[0]
    assert step.status == StepStatus.failed and error_of(step).startswith("stopped at its budget")
    assert step.attempts == 1 and step.cost_usd == pytest.approx(0.25) and run.cost_usd == pytest.approx(0.25)


def test_the_workspace_budget_applies_when_the_flow_has_none(svc: Services, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(CTRL, ws)
    text = (ws / "AGENTS.md").read_text().replace("model: stub\n", "model: stub\nbudget: 0.05\n", 1)
    (ws / "AGENTS.md").write_text(text)
    (ws / "flows" / "nobudget.yaml").write_text("steps:\n  - agent: pricey\n    each: [a, b]\n  - agent: writer\n")
    run = create_run(svc, ws, "nobudget")
    assert run.options["budget"] == 0.05
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert error_of(final).startswith("budget spent")


# -- the judge ---------------------------------------------------------------------------------


def test_a_failing_verdict_fails_the_attempt_and_the_next_attempt_is_told_it(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "judge").run
    assert run.status == RunStatus.completed, run.error
    step = run.steps[0]
    assert step.attempts == 2
    verdicts = [e.text for e in step.events if e.type == "judge"]
    assert verdicts == ["judge (stub): FAIL: the title is missing", "judge (stub): PASS"]
    [second] = [e for e in step.events if e.type == "attempt"]  # the first attempt's start is its record
    assert second.text.startswith("attempt 2") and data_of(second)["told"] == ["the judge failed it: the title is missing"]
    assert len(step.calls) == 4  # the step's turn and the judge's, on each attempt


def test_the_judge_settings_come_from_the_workspace_then_the_account_field_by_field(svc: Services, tmp_path: Path) -> None:
    account = tmp_path / "account"
    ws = account / "ws"
    shutil.copytree(CTRL, ws)
    (account / "AGENTS.md").write_text(
        '---\njudge:\n  model: claude-haiku-4-5\n  stub: "FAIL: said the account"\n---\nAccount.\n'
    )
    text = (ws / "AGENTS.md").read_text()
    head, body = text.split("judge:", 1)
    (ws / "AGENTS.md").write_text(head + "judge:\n  model: stub\n---\nWorkspace.\n")
    run = create_run(svc, ws, "judge")
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    step = final.steps[0]
    verdicts = [e.text for e in step.events if e.type == "judge"]
    # model from the workspace (stub), answers from the account
    assert verdicts[0] == "judge (stub): FAIL: said the account"
    assert final.status == RunStatus.failed


# -- all together ------------------------------------------------------------------------------


def test_a_flow_with_fan_out_rescue_loop_approval_budget_and_judge_runs_to_the_end(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "combined").run
    assert run.status == RunStatus.awaiting_approval, run.error
    researchers = run.steps[:3]
    assert all(s.status == StepStatus.completed for s in researchers)
    failer, checker = run.steps[3], run.steps[4]
    assert failer.status == StepStatus.completed and failer.cycle == 1  # carried by its rescue
    assert failer.result == rescues_of(run, 3)[-1].result
    assert checker.conclusion == "Looks good. APPROVED" and checker.cycle == 1
    assert [r.cycle for r in rescues_of(run, 3)] == [0, 1]
    answer_approval(svc, run.tenant, run.id, approve=True)
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert final.status == RunStatus.completed, final.error
    poster = final.steps[6]
    assert poster.data == {"title": "Tides", "words": 300} and poster.attempts == 2
    assert final.drives == 2 and final.cost_usd < 1.00 and final.options["budget"] == 1.0
