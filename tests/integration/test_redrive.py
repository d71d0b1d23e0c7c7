"""Redriving a failed run (`usecases/redrive.py`), through the real definition on the embedded
engine, on both stores: it goes on from where it failed, keeping what completed, telling the
steps that run again that the run was redriven and why it had failed; completed, stopped,
running, parked and budget-spent runs are refused with the reason and nothing written; of two
redrives at once, one wins."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, error_of, message_of, write_workspace

from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import AttemptStatus, EventType, Run, RunChanges, RunStatus, StepStatus
from laneflow.domain.redrive import REDRIVEN, SUPERSEDED_BY_REDRIVE
from laneflow.ports import Services
from laneflow.usecases.approve import answer_approval
from laneflow.usecases.reconcile import reconcile
from laneflow.usecases.redrive import Redriven, RunNotRedrivable, redrive_run
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import liveness, local_engine

CRASHED = "the writer crashed"

AGENTS: dict[str, dict[str, Any]] = {
    "researcher": {"stub": "cost: 0.01\nFacts about tides."},
    # Its first attempt fails, every later one replies.
    "writer": {"stub": [f"fail: {CRASHED}", "cost: 0.02\nDraft two."]},
    "poster": {"stub": "Posted."},
    # Fails three times, then replies: with `retries: 1`, a run fails after two attempts, and a
    # redrive's first attempt fails too, so only a retry of the redrive's own reaches the reply.
    "stubborn": {"stub": ["fail: one", "fail: two", "fail: three", "Done at last."]},
    "failer": {"stub": "fail: cannot write today"},
    "bad_rescuer": {"stub": "fail: cannot rescue either"},
    "pricey": {"stub": "cost: 0.02\nExpensive facts."},
}

FLOWS: dict[str, dict[str, Any]] = {
    "desk": {"steps": [{"agent": "researcher"}, {"agent": "writer", "retries": 0}, {"agent": "poster"}]},
    "quick": {"steps": [{"agent": "researcher"}]},
    "stubborn": {"steps": [{"agent": "stubborn", "retries": 1}]},
    "rescued": {"steps": [{"agent": "failer", "retries": 0, "on_fail": "bad_rescuer"}, {"agent": "poster"}]},
    "approval": {"steps": [{"agent": "researcher"}, {"approval": "Publish?"}, {"agent": "poster"}]},
    "budget": {"budget": 0.015, "steps": [{"agent": "pricey"}, {"agent": "poster"}]},
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return write_workspace(tmp_path / "ws", AGENTS, FLOWS)


def failed_run(svc: Services, ws: Path, flow: str = "desk") -> Run:
    run = create_run(svc, ws, flow)
    ended = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert ended.status == RunStatus.failed, ended.status
    return ended


def drive(svc: Services, run: Run) -> Run:
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def whole(svc: Services, run: Run) -> dict[str, Any]:
    """The run as stored, with its steps' trace and every attempt: what a refusal must leave."""
    record = svc.store.get_run(run.tenant, run.id).model_dump(mode="json")
    record["attempts"] = [a.model_dump(mode="json") for a in svc.store.list_attempts(run.tenant, run.id)]
    return record


# -- it goes on from where it failed -----------------------------------------------------------


def test_a_redriven_run_completes_keeping_its_completed_step_and_retrying_the_failed_one(on: ServicesOn, ws: Path) -> None:
    svc = on()
    # Given a run whose second step failed (and whose third was skipped for it)
    failed = failed_run(svc, ws)
    researcher, writer, poster = failed.steps
    assert (researcher.status, writer.status, poster.status) == (StepStatus.completed, StepStatus.failed, StepStatus.skipped)
    kept = researcher.model_dump(mode="json")
    kept_attempts = svc.store.list_attempts(failed.tenant, failed.id, 0)

    # When it is redriven and driven
    redriven = redrive_run(svc, failed.tenant, failed.id)
    assert redriven.steps == 2 and redriven.run.status == RunStatus.queued and redriven.run.error is None
    final = drive(svc, redriven.run)

    # Then it completed, its completed step untouched, the failed one on a new attempt
    assert final.status == RunStatus.completed and final.error is None and final.finished_at
    assert (final.redrives, final.drives) == (1, 2)
    assert final.steps[0].model_dump(mode="json") == kept
    assert svc.store.list_attempts(final.tenant, final.id, 0) == kept_attempts
    attempts = svc.store.list_attempts(final.tenant, final.id, 1)
    assert [(a.n, a.status) for a in attempts] == [(1, AttemptStatus.failed), (2, AttemptStatus.completed)]
    assert attempts[0].reason == CRASHED  # the old attempt stays in the record
    writer = final.steps[1]
    assert writer.status == StepStatus.completed and writer.result == "Draft two." and writer.error is None
    assert final.steps[2].status == StepStatus.completed and final.steps[2].skip_reason is None
    assert final.cost_usd == pytest.approx(0.03)  # the kept step's 0.01 and the retried one's 0.02
    assert final.options[REDRIVEN]["error"] == f"step 1 (writer) failed: {CRASHED}"

    # ...and the retried step was told: the run was redriven, why it had failed, its earlier attempt.
    told = message_of(writer)
    assert f"This run was redriven after it failed: step 1 (writer) failed: {CRASHED}." in told
    assert f"attempt 1 ended with a model or network error, not by its own choice: {CRASHED}" in told
    assert "This run was redriven after it failed" in message_of(final.steps[2])  # a skipped step too
    assert "redriven" not in message_of(final.steps[0])
    lines = [e for e in writer.events if e.text.startswith("redriven")]
    assert [(e.type, e.text) for e in lines] == [
        (EventType.info, f"redriven (redrive 1) after the run failed: step 1 (writer) failed: {CRASHED}")
    ]


def test_a_redrive_gives_the_step_its_retries_anew(on: ServicesOn, ws: Path) -> None:
    svc = on()
    failed = failed_run(svc, ws, "stubborn")  # attempts 1 and 2 failed: `retries: 1` spent
    assert failed.steps[0].attempts == 2

    final = drive(svc, redrive_run(svc, failed.tenant, failed.id).run)

    # Attempt 3 failed too, and the redrive's own retry (attempt 4) replied.
    assert final.status == RunStatus.completed, final.error
    assert [a.status for a in svc.store.list_attempts(final.tenant, final.id, 0)] == [
        AttemptStatus.failed,
        AttemptStatus.failed,
        AttemptStatus.failed,
        AttemptStatus.completed,
    ]
    told = message_of(final.steps[0])
    assert "This run was redriven after it failed" in told and "attempt 3 ended with a model or network error" in told


def test_a_failed_rescue_is_superseded_and_a_step_that_fails_again_gets_a_new_one(on: ServicesOn, ws: Path) -> None:
    svc = on()
    failed = failed_run(svc, ws, "rescued")
    [old] = [s for s in failed.steps if s.rescue_of == 0]
    assert old.status == StepStatus.failed

    final = drive(svc, redrive_run(svc, failed.tenant, failed.id).run)

    # The step failed again, and its on_fail ran again, as a new rescue record: the run fails again.
    assert final.status == RunStatus.failed and final.redrives == 1
    rescues = [s for s in final.steps if s.rescue_of == 0]
    assert [(s.index, s.status, s.skip_reason) for s in rescues] == [
        (old.index, StepStatus.skipped, SUPERSEDED_BY_REDRIVE),
        (old.index + 1, StepStatus.failed, None),
    ]
    assert len(svc.store.list_attempts(final.tenant, final.id, old.index)) == 1  # its attempt stays
    assert final.steps[0].attempts == 2 and "step 0 (failer) failed" in error_of(final)


def test_a_rejected_run_redriven_asks_for_its_approval_again(on: ServicesOn, ws: Path) -> None:
    svc = on()
    parked = drive(svc, create_run(svc, ws, "approval"))
    rejected = answer_approval(svc, parked.tenant, parked.id, approve=False)
    assert rejected.status == RunStatus.failed

    final = drive(svc, redrive_run(svc, rejected.tenant, rejected.id).run)

    assert final.status == RunStatus.awaiting_approval and final.steps[1].status == StepStatus.awaiting_approval
    assert final.steps[0].attempts == 1  # the researcher's step was kept


# -- what is refused, and nothing written for it -----------------------------------------------


def refused(svc: Services, run: Run, reason: str) -> None:
    before = whole(svc, run)
    with pytest.raises(RunNotRedrivable, match=reason):
        redrive_run(svc, run.tenant, run.id)
    assert whole(svc, run) == before


def test_completed_running_parked_stopped_and_budget_spent_runs_are_refused_with_the_reason(on: ServicesOn, ws: Path) -> None:
    svc = on()
    completed = drive(svc, create_run(svc, ws, "quick"))
    refused(svc, completed, f"run {completed.id} completed: there is nothing to redrive")

    queued = create_run(svc, ws, "quick")
    refused(svc, queued, f"run {queued.id} is queued: it has not failed, so there is nothing to redrive")
    running = svc.store.update_run(queued.tenant, queued.id, RunChanges(status=RunStatus.running))
    refused(svc, running, f"run {running.id} is running: it has not failed")

    parked = drive(svc, create_run(svc, ws, "approval"))
    refused(svc, parked, f"run {parked.id} is waiting for a person")

    to_stop = create_run(svc, ws, "quick")
    stopped = stop_run(svc, to_stop.tenant, to_stop.id).run  # queued: closed at once
    assert stopped.status == RunStatus.failed and stopped.stop_requested
    refused(svc, stopped, f"run {stopped.id} was stopped by a person: a stopped run is not redriven")

    spent = failed_run(svc, ws, "budget")
    refused(svc, spent, r"its budget is spent \(budget spent: \$0\.0200 of \$0\.01\)")


def test_a_run_that_is_not_there_is_run_not_found(on: ServicesOn) -> None:
    with pytest.raises(RunNotFound, match="no run 'run-nope'"):
        redrive_run(on(), "local", "run-nope")


# -- one redrive wins ----------------------------------------------------------------------------


def test_of_two_redrives_at_once_one_wins_and_the_other_is_refused(on: ServicesOn, ws: Path) -> None:
    svc = on()
    failed = failed_run(svc, ws)
    start = threading.Barrier(2)
    won: list[Redriven] = []
    lost: list[RunNotRedrivable] = []

    def redrive() -> None:
        start.wait()
        try:
            won.append(redrive_run(svc, failed.tenant, failed.id))
        except RunNotRedrivable as refusal:
            lost.append(refusal)

    threads = [threading.Thread(target=redrive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert len(won) == 1 and len(lost) == 1, (won, lost)
    run = svc.store.get_run(failed.tenant, failed.id)
    assert run.redrives == 1 and run.status == RunStatus.queued
    marks = [e for e in run.steps[1].events if e.text.startswith("redriven")]
    assert len(marks) == 1  # the step was set pending, and said so, once
    assert drive(svc, run).status == RunStatus.completed


def test_a_redrive_that_read_the_run_failed_after_another_took_it_is_refused_by_the_store(
    on: ServicesOn, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal does not rest on the read: a redrive whose read of the run is stale (the
    run was failed then; another redrive took it since) is refused by the conditional write."""
    svc = on()
    failed = failed_run(svc, ws)
    stale = svc.store.get_run(failed.tenant, failed.id, steps=False)
    redrive_run(svc, failed.tenant, failed.id)
    real = svc.store.get_run
    reads = iter([stale])
    monkeypatch.setattr(svc.store, "get_run", lambda *a, **k: next(reads, None) or real(*a, **k))

    with pytest.raises(RunNotRedrivable, match="was redriven by another request first .it is queued now"):
        redrive_run(svc, failed.tenant, failed.id)

    run = real(failed.tenant, failed.id)
    assert run.redrives == 1 and len([e for e in run.steps[1].events if e.text.startswith("redriven")]) == 1


# -- the drive limit counts from the latest redrive ---------------------------------------------


def test_reconcile_counts_a_redriven_runs_drives_from_its_latest_redrive(on: ServicesOn, ws: Path) -> None:
    """A run its drives left at the limit, then redriven, may be re-driven again after a crash
    (its drives since the redrive are under the limit); one never redriven is closed."""
    svc = on(LANEFLOW_MAX_DRIVES="3")
    crashed = []
    for redriven_at in (3, None):
        run = create_run(svc, ws, "quick")
        options = {**run.options, REDRIVEN: {"n": 1, "drives": redriven_at}} if redriven_at is not None else run.options
        svc.store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, drives=4, options=options))
        crashed.append(run.id)

    report = reconcile(svc, liveness(), redrive=None)

    redriven, never = crashed
    assert report.to_redrive == [redriven] and report.closed == [never]
    assert "its drive went away 4 times (the limit is 3 drives)" in error_of(svc.store.get_run("local", never))


# -- the count on both stores, and SQLite's migration of it ------------------------------------


def test_a_runs_redrives_is_kept_and_changed_on_both_stores(on: ServicesOn, ws: Path) -> None:
    svc = on()
    run = create_run(svc, ws, "quick")
    assert svc.store.get_run(run.tenant, run.id).redrives == 0
    svc.store.update_run(run.tenant, run.id, RunChanges(redrives=3))
    assert svc.store.get_run(run.tenant, run.id).redrives == 3
    assert [r.redrives for r in svc.store.list_runs(run.tenant)] == [3]


def test_a_database_of_migration_10_gains_runs_redrives_and_its_runs_read_with_no_redrives(tmp_path: Path) -> None:
    from integration.test_store_sqlite_migrations import columns, made_by_the_first_migrations, version

    from laneflow.adapters.store.sqlite import SqliteStore
    from laneflow.adapters.store.sqlite_schema import MIGRATIONS

    path = tmp_path / "ten.db"
    made_by_the_first_migrations(path, [n for n, _, _ in MIGRATIONS].index(10) + 1)
    assert version(path)[0] == 10 and "redrives" not in columns(path, "runs")
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO runs (tenant, id, workspace, flow, status, input, created_at, options, flow_spec)"
            " VALUES ('local', 'r1', 'w', 'f', 'failed', '{}', '2026-01-01', '{}', '{}')"
        )
    store = SqliteStore(path)
    try:
        assert version(path)[0] == MIGRATIONS[-1][0] and "redrives" in columns(path, "runs")
        assert store.get_run("local", "r1").redrives == 0
    finally:
        store.close()
