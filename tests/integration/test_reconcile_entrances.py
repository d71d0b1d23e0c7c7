"""Who reconciles, and what each does with an interrupted run: `laneflow serve` re-drives it at
its start and at every later reconcile (LANEFLOW_RECONCILE_INTERVAL); `laneflow run` settles
what crashed runs left, names each interrupted run and how to go on, and drives only its own
run. Real `laneflow` processes on one SQLite store, the real definition on the embedded engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import stderr_of, write_workspace

from laneflow.adapters.store import open_store
from laneflow.domain.records import AttemptStatus, RunStatus, StepStatus, utcnow
from laneflow.domain.workers import LocalProcess
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.reconcile import INTERRUPTED
from laneflow.usecases.start_run import prepare_run
from laneflow.wiring import for_store

EXE = Path(sys.executable).parent / "laneflow"


def desk(root: Path) -> Path:
    return write_workspace(
        root / "ws",
        {"scout": {"stub": "Found it."}, "writer": {"stub": "Written."}},
        {"brief": {"steps": [{"agent": "scout"}, {"agent": "writer"}]}},
    )


def gone_process() -> LocalProcess:
    child = subprocess.Popen(["true"])
    child.wait()
    return LocalProcess(host=socket.gethostname(), pid=child.pid, started="gone")


def interrupted_run(svc: Services, ws: Path) -> str:
    """A run as a killed `laneflow run` leaves it: running, driven once by a process that is
    gone, its first step's attempt running on that process. Written whole, in one write."""
    gone = gone_process()
    run = prepare_run(svc, ws, "brief")
    run.status, run.driver, run.drives, run.driven_at = RunStatus.running, gone, 1, utcnow()
    svc.store.create_run(run)
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t-gone", started_at=utcnow(), worker=gone)
    return run.id


def services(store: str, tmp_path: Path) -> Services:
    return for_store(open_store(store), Settings(capture_dir=str(tmp_path / "captures")))


def wait_until_completed(svc: Services, run_id: str, within_s: float = 60) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if svc.store.get_run("local", run_id, steps=False).status == RunStatus.completed:
            return True
        time.sleep(0.1)
    return False


def test_serve_re_drives_an_interrupted_run_at_its_start_and_at_a_later_reconcile(tmp_path: Path) -> None:
    ws = desk(tmp_path)
    store = f"sqlite:///{tmp_path / 'serve.db'}"
    svc = services(store, tmp_path)
    first = interrupted_run(svc, ws)
    env = {**os.environ, "LANEFLOW_RECONCILE_INTERVAL": "0.5", "LANEFLOW_STEP_WORKERS": "0"}
    proc = subprocess.Popen(
        [str(EXE), "serve", "--store", store, "--port", "0", "--workspaces", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        # At its start: the run left behind is re-driven (completed steps carried)
        assert wait_until_completed(svc, first), stderr_of(proc) if proc.poll() is not None else "not re-driven"
        # Later, while it serves: another run's worker goes away, and a periodic reconcile re-drives it
        second = interrupted_run(svc, ws)
        assert wait_until_completed(svc, second), stderr_of(proc) if proc.poll() is not None else "not re-driven"
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
            ended_on_term = True
        except subprocess.TimeoutExpired:  # said below, not over the body's own error
            proc.kill()
            _, err = proc.communicate()
            ended_on_term = False
    assert ended_on_term, f"laneflow serve did not end on SIGTERM: {err[-2000:]}"
    for run_id in (first, second):
        run = svc.store.get_run("local", run_id)
        assert run.drives == 2 and [s.status for s in run.steps] == [StepStatus.completed] * 2
        [told, again] = svc.store.list_attempts("local", run_id, 0)
        assert told.status == AttemptStatus.interrupted and told.reason == INTERRUPTED and again.status == AttemptStatus.completed
    assert f"reconcile: re-driven: {first}" in err and f"reconcile: re-driven: {second}" in err


def test_laneflow_run_names_an_interrupted_run_and_how_to_go_on_and_leaves_it_to_the_person(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = desk(tmp_path)
    store = f"sqlite:///{tmp_path / 'run.db'}"
    svc = services(store, tmp_path)
    left = interrupted_run(svc, ws)

    assert main(["run", str(ws), "brief", "--store", store]) == 0
    err = capsys.readouterr().err
    assert (
        f"run {left} (ws/brief) was interrupted: laneflow resume {left} --store {store} re-drives it now "
        f"(laneflow reconcile --store {store} re-drives every such run; laneflow stop {left} --store {store} ends it)"
    ) in err
    # Its own run was driven; the interrupted one was not: still running, its attempt marked interrupted
    after = svc.store.get_run("local", left)
    assert after.status == RunStatus.running and after.drives == 1 and after.finished_at is None
    assert [s.status for s in after.steps] == [StepStatus.pending] * 2
    [attempt] = svc.store.list_attempts("local", left, 0)
    assert attempt.status == AttemptStatus.interrupted
    # The command it printed works as printed
    assert main(["resume", left, "--store", store, "--quiet"]) == 0
    assert svc.store.get_run("local", left, steps=False).status == RunStatus.completed


def test_serves_drives_start_a_run_once_while_they_drive_it_or_wait_for_a_place_for_it() -> None:
    # A periodic reconcile sees a run serve has started but not yet picked up (still queued,
    # waiting for a place): asking again must not drive it twice.
    import threading

    from laneflow.adapters.engine.local import LocalDrives

    release, made = threading.Event(), []

    def engine() -> None:  # each drive makes its engine; this one holds its place until released
        made.append(1)
        release.wait(10)
        raise RuntimeError("no engine in this test")

    drives = LocalDrives(engine, pool=1)  # type: ignore[arg-type]
    for run_id in ("run-a", "run-a", "run-b", "run-b"):
        drives.start("local", run_id)
    assert sorted(t.name for t in drives.threads) == ["local-drive-run-a", "local-drive-run-b"]
    release.set()
    drives.join(10)
    assert len(made) == 2
