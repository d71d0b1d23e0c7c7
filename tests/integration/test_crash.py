"""Crash-safety, proven by killing the runner: a real `laneflow run` process is SIGKILLed
at each named point of the step lifecycle (usecases/crashpoints.py), then `laneflow reconcile`
runs in a second process. After each: no two attempts of a step ran at once, no completed
result was lost or run again, no rescue was duplicated, nothing is left running, and the
run ends as it would have without the crash."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, error_of

from laneflow.adapters.store import open_store
from laneflow.domain.records import AttemptStatus, Run, RunChanges, RunStatus, StepStatus
from laneflow.ports import Services, Store
from laneflow.usecases.crashpoints import POINTS

pytestmark = pytest.mark.slow  # every test here starts real `laneflow` processes

CTRL = FIXTURES / "ws_control"
EXE = Path(sys.executable).parent / "laneflow"


def laneflow(*args: str, cwd: Path, crash: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "LANEFLOW_CRASH_AT"}
    if crash:
        environ["LANEFLOW_CRASH_AT"] = crash
    environ.update(env)
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=environ)


def assert_invariants(db: Store, run: Run) -> None:
    attempts = db.list_attempts(run.tenant, run.id)
    by_step: dict[int, list[Any]] = {}
    for a in attempts:
        by_step.setdefault(a.index, []).append(a)
    for index, tries in by_step.items():
        tries.sort(key=lambda a: a.n)
        for earlier, later in itertools.pairwise(tries):
            assert earlier.ended_at and earlier.ended_at <= later.started_at, f"step {index}: attempts overlapped"
        completed = [a for a in tries if a.status == AttemptStatus.completed]
        assert len(completed) <= 1, f"step {index} completed twice: a finished result was run again"
    assert not [a for a in attempts if a.status == AttemptStatus.running], "an attempt is left running"
    assert not [s for s in run.steps if s.status == StepStatus.running], "a step is left running"
    if run.status.ended:  # a run that ends leaves no step pending: what did not run is skipped, with why
        waiting = [s.index for s in run.steps if s.status in (StepStatus.pending, StepStatus.awaiting_approval)]
        assert not waiting, f"the ended run left steps {waiting} waiting"
        assert all(s.skip_reason for s in run.steps if s.status == StepStatus.skipped)
    rescues = Counter((s.rescue_of, s.cycle) for s in run.steps if s.rescue_of is not None and s.status != StepStatus.skipped)
    assert all(n == 1 for n in rescues.values()), f"a rescue was duplicated: {rescues}"
    for step in run.steps:
        if step.status == StepStatus.completed and step.agent:
            assert step.result, f"step {step.index} completed without its result"


def crash_then_reconcile(tmp_path: Path, flow: str, point: str) -> tuple[Any, ...]:
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    crashed = laneflow("run", str(CTRL), flow, "--store", store, "--quiet", "--json", cwd=tmp_path, crash=point)
    assert crashed.returncode == -9, f"the runner was not killed at {point}: {crashed.returncode} {crashed.stderr[-500:]}"
    db = open_store(store)
    [before] = db.list_runs("local")
    reconciled = laneflow("reconcile", "--store", store, "--json", cwd=tmp_path)
    assert reconciled.returncode == 0, reconciled.stderr
    return db, before, json.loads(reconciled.stdout), db.get_run("local", before.id)


CASES = [
    ("after-journal:3", "rescue"),
    ("after-claim:2", "rescue"),
    ("executor-started:3", "rescue"),
    ("mid-model-call:1", "rescue"),
    ("after-result:2", "rescue"),
    ("group-transition:2", "rescue"),
    ("rescue-running:1", "rescue"),
]


@pytest.mark.parametrize("point, flow", CASES, ids=[p for p, _ in CASES])
def test_a_runner_killed_at_this_point_recovers_as_if_it_had_not_crashed(tmp_path: Path, point: Any, flow: Any) -> None:
    db, before, report, run = crash_then_reconcile(tmp_path, flow, point)
    assert before.status == RunStatus.running  # the crash left it mid-flight
    assert run.id in report["redriven"]
    assert_invariants(db, run)
    assert run.status == RunStatus.completed, run.error
    writer, polish = run.steps[2], run.steps[3]
    assert writer.status == StepStatus.completed and polish.status == StepStatus.completed
    assert run.drives == 2


def test_every_named_crash_point_is_exercised() -> None:
    exercised = {p.split(":")[0] for p, _ in CASES} | {"parked"}
    assert exercised == set(POINTS)


def test_a_claim_asked_for_but_never_landed_is_settled_cancelled(tmp_path: Path) -> None:
    db, before, report, run = crash_then_reconcile(tmp_path, "rescue", "after-journal:1")
    assert [j["status"] for j in report["journal"]] == ["cancelled"]
    [op] = [j["op_id"] for j in report["journal"]]
    assert db.journal_pending() == [] and db.journal_settle("local", run.id, op).status == "cancelled"  # settled: as it is
    assert run.status == RunStatus.completed


def test_an_attempt_whose_worker_died_is_interrupted_and_its_step_told_the_truth(tmp_path: Path) -> None:
    db, before, report, run = crash_then_reconcile(tmp_path, "rescue", "mid-model-call:1")
    outcomes = [(a["index"], a["attempt"], a["outcome"]) for a in report["attempts"]]
    assert (0, 1, "interrupted") in outcomes
    first = db.list_attempts("local", run.id, 0)
    assert [a.status for a in first] == [AttemptStatus.interrupted, AttemptStatus.completed]
    assert first[0].reason == "interrupted: its worker went away"
    retried = [e for e in run.steps[0].events if e.type == "attempt"][-1]
    assert retried.data["told"] == ["interrupted: its worker went away"]
    assert "- attempt 1 was interrupted: its worker went away, not by its own choice." in run.steps[0].message


def test_a_parked_run_survives_its_runner_dying_and_is_not_polled(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    crashed = laneflow("run", str(CTRL), "approval", "--store", store, "--quiet", cwd=tmp_path, crash="parked")
    assert crashed.returncode == -9
    db = open_store(store)
    [run] = db.list_runs("local")
    assert run.status == RunStatus.awaiting_approval
    report = json.loads(laneflow("reconcile", "--store", store, "--json", cwd=tmp_path).stdout)
    assert report["waiting"] == [run.id] and report["redriven"] == []
    approved = laneflow("approve", run.id, "--store", store, "--json", cwd=tmp_path)
    assert json.loads(approved.stdout)["status"] == "completed"
    assert_invariants(db, db.get_run("local", run.id))


def test_an_answered_approval_whose_drive_never_started_is_re_driven(tmp_path: Path, svc: Services) -> None:
    """`approve` records the answer, then crashes before its drive starts: reconcile drives it."""
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    parked = json.loads(laneflow("run", str(CTRL), "approval", "--store", store, "--json", cwd=tmp_path).stdout)
    approved = laneflow("approve", parked["id"], "--store", store, cwd=tmp_path, crash="group-transition:1")
    assert approved.returncode == -9
    report = json.loads(laneflow("reconcile", "--store", store, "--json", cwd=tmp_path).stdout)
    assert report["redriven"] == [parked["id"]]
    db = open_store(store)
    run = db.get_run("local", parked["id"])
    assert run.status == RunStatus.completed and run.drives == 3
    assert_invariants(db, run)


def test_past_the_drive_limit_the_run_is_closed_failed_with_the_reason(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    crashed = laneflow("run", str(CTRL), "rescue", "--store", store, "--quiet", cwd=tmp_path, crash="after-claim:2")
    assert crashed.returncode == -9
    report = json.loads(laneflow("reconcile", "--store", store, "--json", cwd=tmp_path, LANEFLOW_MAX_DRIVES="1").stdout)
    db = open_store(store)
    [run] = db.list_runs("local")
    assert report["closed"] == [run.id] and report["redriven"] == []
    run = db.get_run("local", run.id)
    assert run.status == RunStatus.failed and "its drive went away 1 times" in error_of(run)
    assert_invariants(db, run)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["run_id"], e["status"]) for e in events] == [(run.id, "failed")]  # the on-end hook was told


def test_a_stopped_run_whose_drive_died_is_closed_not_re_driven(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    laneflow("run", str(CTRL), "rescue", "--store", store, "--quiet", cwd=tmp_path, crash="after-claim:2")
    db = open_store(store)
    [run] = db.list_runs("local")
    db.request_stop("local", run.id)
    report = json.loads(laneflow("reconcile", "--store", store, "--json", cwd=tmp_path).stdout)
    assert report["closed"] == [run.id]
    run = db.get_run("local", run.id)
    assert run.status == RunStatus.failed and run.finished_at
    assert_invariants(db, run)


def test_reconcile_leaves_a_live_run_alone(tmp_path: Path, svc: Services) -> None:
    """A run whose drive is alive (this process) is not re-driven and its attempts continue."""
    from laneflow.adapters.workers import Liveness, local_worker
    from laneflow.usecases.reconcile import reconcile
    from laneflow.usecases.start_run import create_run

    run = create_run(svc, CTRL, "rescue")
    svc.store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, driver=local_worker()))
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 8, started_at="2026-01-01T00:00:00.000Z", worker=local_worker())
    report = reconcile(svc, Liveness(), redrive=lambda r: pytest.fail("re-drove a live run"))
    assert [a.outcome for a in report.attempts] == ["continued"] and report.redriven == []
