"""A local runner that gets SIGINT (Ctrl-C) or SIGTERM is a worker going away, not a failure:
its running attempts are marked interrupted by exact identity, the run stays resumable, the
command says how to go on and exits 130 / 143; `laneflow resume RUN` (or reconcile) then
finishes the run, carrying what completed and telling each interrupted step why it runs
again. Real `laneflow` processes, the real definition on the embedded engine."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract.store.backends import BACKENDS
from helpers import FIXTURES, data_of, stderr_of, wait_for_run
from test_account import ACCOUNT_RULE, agents_md_layer
from test_crash import assert_invariants

from laneflow.adapters.store import open_store
from laneflow.adapters.workers import Liveness, _process_start, local_worker
from laneflow.domain.records import Attempt, AttemptStatus, RunChanges, RunStatus, StepStatus
from laneflow.domain.workers import LocalProcess, WorkerRef
from laneflow.entrypoints.cli import main
from laneflow.ports import Services, Store
from laneflow.settings import Settings
from laneflow.usecases.reconcile import INTERRUPTED, leave_drive
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store

WS = FIXTURES / "ws_interrupt"
EXE = Path(sys.executable).parent / "laneflow"
SLOW = (2, 3)  # the `slow` flow's middle group: its first attempts take a minute


def laneflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def interrupt_mid_flight(
    tmp_path: Path, *signals: signal.Signals, extra: tuple[str, ...] = ()
) -> tuple[int, str, str, float, str, Store, str]:
    """Run the `slow` flow in a real `laneflow run`, wait until both slow steps are running,
    send the signals (10 ms apart: the first has been handled, its cleanup is under way)."""
    store = f"sqlite:///{tmp_path / 'int.db'}"
    proc = subprocess.Popen(
        [str(EXE), "run", str(WS), "slow", "--store", store, "--quiet", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    db, run_id = wait_for_run(
        proc,
        tmp_path / "int.db",
        store,
        lambda db, run: [s.status for s in db.get_steps("local", run.id) if s.index in SLOW] == ["running"] * 2,
    )
    assert run_id, f"the slow steps never ran: {stderr_of(proc) if proc.poll() is not None else 'timeout'}"
    sent = time.monotonic()
    for n, sig in enumerate(signals):
        if n:
            time.sleep(0.01)
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, time.monotonic() - sent, store, db, run_id


def assert_resumable(db: Store, run_id: str) -> None:
    run = db.get_run("local", run_id)
    assert run.status == RunStatus.running and run.finished_at is None and not run.error
    assert [s.status for s in run.steps] == [StepStatus.completed] * 2 + [StepStatus.pending] * 3
    for index in SLOW:
        [attempt] = db.list_attempts("local", run_id, index)
        assert attempt.status == AttemptStatus.interrupted and attempt.reason == INTERRUPTED
    assert not [a for a in db.list_attempts("local", run_id) if a.status == AttemptStatus.running]


def assert_finished_telling_the_truth(db: Store, run_id: str) -> None:
    run = db.get_run("local", run_id)
    assert run.status == RunStatus.completed, run.error
    assert run.drives == 2
    assert_invariants(db, run)
    assert [run.steps[i].attempts for i in (0, 1)] == [1, 1]  # completed steps carried, not re-run
    for index in SLOW:
        step = run.steps[index]
        assert step.attempts == 2 and step.result == "Written on the second try."
        retried = [e for e in step.events if e.type == "attempt"][-1]
        assert data_of(retried)["told"] == [INTERRUPTED]


@pytest.mark.slow
def test_ctrl_c_leaves_the_run_resumable_and_resume_finishes_it_telling_the_step_it_was_interrupted(tmp_path: Path) -> None:
    code, out, err, _, store, db, run_id = interrupt_mid_flight(tmp_path, signal.SIGINT)
    assert code == 130, err
    # The commands it names carry the store and this program as invoked (its path, when not on PATH).
    said = rf"laneflow: interrupted; run {run_id} is resumable: (\S*)laneflow resume {run_id} --store (\S+) "
    said += rf"\(or \1laneflow reconcile --store \2; \1laneflow stop {run_id} --store \2 to end it\)"
    assert (found := re.search(said, err)) and found.group(2) == store, err
    # The minute-long attempts did not hold the runner: they ended interrupted, not answered
    assert_resumable(db, run_id)
    assert db.get_run("local", run_id).driver is None  # its drive ended

    resumed = laneflow("resume", run_id, "--store", store, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"{run_id}: completed (5 completed)")
    assert f"resuming run {run_id} (drive 2); completed steps are carried" in resumed.stderr
    assert_finished_telling_the_truth(db, run_id)


@pytest.mark.slow
def test_sigterm_leaves_the_run_resumable_and_reconcile_re_drives_it_with_its_account(tmp_path: Path) -> None:
    account = tmp_path / "account"
    account.mkdir()
    (account / "AGENTS.md").write_text(f"---\nbudget: 3.0\n---\n{ACCOUNT_RULE}\n")
    code, out, err, _, store, db, run_id = interrupt_mid_flight(tmp_path, signal.SIGTERM, extra=("--account", str(account)))
    assert code == 143, err
    assert re.search(rf"run {run_id} is resumable: \S*laneflow resume {run_id} --store ", err), err
    assert_resumable(db, run_id)

    reconciled = laneflow("reconcile", "--store", store, "--json", cwd=tmp_path)
    assert reconciled.returncode == 0, reconciled.stderr
    assert json.loads(reconciled.stdout)["redriven"] == [run_id]
    assert_finished_telling_the_truth(db, run_id)
    # The re-drive, in another process, read the workspace with the run's account again.
    expected = agents_md_layer(WS, "slow", account)
    for index in SLOW:
        [layer] = [each for each in db.get_step("local", run_id, index, detail=True).prompt_layers if each.name == "agents.md"]
        assert layer == expected


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_cleanup_exits_at_once_and_reconcile_finishes_the_job(tmp_path: Path) -> None:
    code, out, err, _, store, db, run_id = interrupt_mid_flight(tmp_path, signal.SIGINT, signal.SIGINT)
    # 130 from the handler; had the cleanup already ended, the process was past its last
    # line and the second Ctrl-C ended it as the shell's default would (killed by SIGINT).
    # (Had it waited for the minute-long attempts instead, they would have answered: the
    # reconcile below finds each slow step on its second attempt, the first never answered.)
    assert code in (130, -signal.SIGINT), err
    run = db.get_run("local", run_id)
    assert run.status == RunStatus.running and not run.error  # not failed, whatever the cleanup reached
    reconciled = laneflow("reconcile", "--store", store, "--json", cwd=tmp_path)
    assert reconciled.returncode == 0 and json.loads(reconciled.stdout)["redriven"] == [run_id]
    assert_finished_telling_the_truth(db, run_id)


def test_a_second_signal_while_the_cleanup_runs_exits_at_once(tmp_path: Path) -> None:
    """The handler itself: the first signal raises into the cleanup; a second one during
    that cleanup ends the process there and then, with 128 + its number."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from laneflow.entrypoints.cli import Interrupted, leaving_on_signals
        with leaving_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            except Interrupted as first:
                print("cleanup after", first.signum, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                print("cleanup finished", flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    # It left during the cleanup's 30 s sleep: the cleanup never printed its end
    assert proc.returncode == 143 and proc.stdout == f"cleanup after {int(signal.SIGINT)}\n"
    assert "interrupted again: leaving now; `laneflow reconcile` finishes the cleanup" in proc.stderr


# -- laneflow resume refuses what it cannot resume -----------------------------------------------


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'resume.db'}"


def test_resume_refuses_a_run_that_has_ended(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(WS), "retry", "--store", store_url, "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["resume", run_id, "--store", store_url]) == 2
    assert f"run {run_id} has ended (completed): there is nothing to resume" in capsys.readouterr().err


def test_resume_refuses_a_parked_run_and_says_to_approve_it(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(FIXTURES / "ws_control"), "approval", "--store", store_url, "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["resume", run_id, "--store", store_url]) == 2
    assert (
        f"run {run_id} is waiting for a person, not for a drive: answer it with laneflow approve {run_id}"
        in capsys.readouterr().err
    )


def test_resume_refuses_a_run_whose_drive_is_alive_in_another_process(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    svc = for_store(open_store(store_url))
    run = create_run(svc, WS, "slow")
    svc.store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, driver=local_worker()))
    assert main(["resume", run.id, "--store", store_url]) == 2
    err = capsys.readouterr().err
    assert f"run {run.id} is still being driven by process {os.getpid()}" in err and f"laneflow stop {run.id}" in err
    assert svc.store.get_run(run.tenant, run.id).drives == 0  # nothing was driven


def test_resume_of_an_unknown_run_exits_2_naming_it(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resume", "run-nope", "--store", store_url]) == 2
    assert "run-nope" in capsys.readouterr().err


# -- the store side of a worker leaving, on both stores --------------------------------------------


@pytest.fixture
def svc_on(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


def test_a_leaving_worker_interrupts_only_its_own_attempts_by_identity_and_ends_its_drive(
    svc_on: Services, tmp_path: Path
) -> None:
    svc, me = svc_on, local_worker()
    run = create_run(svc, WS, "slow")
    svc.store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, driver=me))
    other = subprocess.Popen(["sleep", "60"])  # another live worker on this host
    try:
        theirs = LocalProcess(host=me.host, pid=other.pid, started=_process_start(other.pid))

        def claim(index: int, worker: WorkerRef | None) -> Attempt:
            return svc.store.claim_attempt(
                run.tenant, run.id, index, token=f"token-{index}", started_at="2026-01-01T00:00:00.000Z", worker=worker
            )

        claim(0, me)
        claim(1, theirs)
        claim(2, None)  # claimed, no worker written yet: it lives with this drive
        left = leave_drive(svc, run.tenant, run.id, me, Liveness(gone=me))
        again = leave_drive(svc, run.tenant, run.id, me, Liveness(gone=me))  # safe to repeat
    finally:
        other.kill()
        other.wait()
    assert left.status == RunStatus.running and left.driver is None and again.driver is None
    statuses = {a.index: a.status for a in svc.store.list_attempts(run.tenant, run.id)}
    assert statuses == {0: AttemptStatus.interrupted, 1: AttemptStatus.running, 2: AttemptStatus.interrupted}
    steps = svc.store.get_steps(run.tenant, run.id)
    assert [steps[i].status for i in (0, 1, 2)] == [StepStatus.pending, StepStatus.running, StepStatus.pending]
    assert steps[0].error == INTERRUPTED
