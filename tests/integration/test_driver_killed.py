"""kill -9 of the driver (the `laneflow run` process, which hosts the embedded engine) while a
sandboxed step runs its script: interrupted, never failed.

The orphaned sandbox worker hears its engine's relay close and goes at once, recording
nothing that ends its attempt; `laneflow reconcile` then finds the worker gone, marks the
attempt interrupted and resumes the run, which ends completed with no completed step run
again. Twenty trials, each killing its driver at a seeded point while a script runs (in
the first group, a gated lane of two, or in the second), on a store of its own. In one trial
out of five the completion races the driver's death: the driver is frozen while the script
runs, the worker writes its completion (and waits for the frozen engine to hear it), then
the driver is killed; that completed attempt stays completed and is carried, not redone.

Twenty cold starts of `laneflow` (each imports the engine and parses the definition: about
5 s of CPU) would not fit the time of one test on a small machine, so the first trial runs
the console script itself and the others run the same command (`cli.main`) in processes
forked from a parent that made those imports once (`WARM_PARENT`): each is still one
process hosting the engine, its sandbox workers its own, killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import data_of, local_pid
from test_crash import assert_invariants

from laneflow.adapters.store import open_store
from laneflow.domain.records import AttemptStatus, RunStatus, StepStatus
from laneflow.ports import Store
from laneflow.usecases.reconcile import INTERRUPTED

pytestmark = pytest.mark.slow

EXE = Path(sys.executable).parent / "laneflow"
SEED = 8_2026
TRIALS = int(os.environ.get("KILL_TRIALS", 20))
LANES = 2  # trials run two at a time
NAP_S = 0.8  # how long each step's script runs
GROUPS = {0: ("a", "b"), 1: ("c",)}  # the items of each group's steps (a lane of two, then one)

WARM_PARENT = textwrap.dedent(
    """
    import faulthandler, json, os, signal, sys
    from laneflow.adapters.engine.local import install_interpreter_hook
    from laneflow.adapters.store import open_store
    from laneflow.entrypoints.cli import main
    from laneflow.wiring import for_store, local_engine
    import laneflow.adapters.executors.stub, laneflow.usecases.run_step.runner
    install_interpreter_hook()
    local_engine(for_store(open_store("sqlite:///:memory:"))).state_machine_arn  # the definition, parsed once
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        if "wait" in ask:
            _, status = os.waitpid(ask["wait"], 0)
            print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            log = os.open(ask["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            sys.stdout, sys.stderr = os.fdopen(1, "w"), os.fdopen(2, "w")
            faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks() asks for them
            code = 1
            try:
                code = main(ask["argv"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
    """
)


class WarmParent:
    """Forks `laneflow` commands (`cli.main`) from a process that imported the engine once."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WARM_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert "ready" in self._answer(), "the warm parent did not start"

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline() or "{}")
        return answer

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def start(self, argv: list[str], log: Path) -> int:
        return int(self._ask({"argv": argv, "log": str(log)})["pid"])

    def wait(self, pid: int) -> int:
        return int(self._ask({"wait": pid})["code"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


class ConsoleScript:
    """The `laneflow` console script itself, a fresh interpreter each time."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[str]] = {}

    def start(self, argv: list[str], log: Path) -> int:
        with open(log, "w") as out:
            proc = subprocess.Popen([str(EXE), *argv], stdout=out, stderr=subprocess.STDOUT)
        self.procs[proc.pid] = proc  # type: ignore[assignment]
        return proc.pid

    def wait(self, pid: int) -> int:
        return self.procs.pop(pid).wait(180)


def stacks(pid: int, log: Path) -> str:
    """The tail of a forked command's log after it was asked to write every thread's stack
    there (a command that seems stuck says where it is)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
    return log.read_text()[-6000:]


def workspace(root: Path) -> Path:
    """A stub flow of two groups of sandboxed steps (a gated lane of two, then one), each
    running a script that naps."""
    (root / "agents" / "maker").mkdir(parents=True)
    (root / "agents" / "maker" / "agent.md").write_text(
        '---\ntools: [scripts]\nstub: |\n  tool: script_nap {"args": ["{item}"]}\n  ===\n  Made {item}.\n---\nYou make things.\n'
    )
    (root / "scripts").mkdir()
    (root / "scripts" / "nap").write_text(f"#!/bin/sh\n# Naps a moment.\nsleep {NAP_S}\necho napped $1\n")
    (root / "scripts" / "nap").chmod(0o755)
    (root / "flows").mkdir()
    steps = "".join(
        f"  - agent: maker\n    each: {list(items)}\n    parallel: 2\n    instruction: Make {{item}}.\n"
        for items in GROUPS.values()
    )
    (root / "flows" / "make.yaml").write_text("steps:\n" + steps)
    (root / "AGENTS.md").write_text("---\nmodel: stub\n---\nBe brief.\n")
    return root


def naps_of(ws: Path) -> dict[str, tuple[int, float]]:
    """The workspace's scripts running now (in the attempts' scratch copies, named like it):
    item -> (pid, seconds it has run)."""
    ticks, uptime = os.sysconf("SC_CLK_TCK"), float(Path("/proc/uptime").read_text().split()[0])
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry.name}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(argv) > 2 and argv[1].endswith(f"/{ws.name}/scripts/nap".encode()) and not argv[0].endswith(b"bwrap"):
            found[argv[2].decode()] = (int(entry.name), uptime - int(stat[19]) / ticks)
    return found


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_until(check: Callable[[], bool], within_s: float, poll_s: float = 0.01) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return check()


@dataclass
class Trial:
    n: int
    race: bool
    group: int
    delay_s: float
    run_id: str = ""
    mid_script: set[int] = field(default_factory=set)  # steps whose script ran on when the driver died
    raced: set[int] = field(default_factory=set)  # steps whose completion landed while the driver was frozen
    unfinished: list[Any] = field(default_factory=list)  # attempts left running once the workers had gone
    worker_gone_s: float = 0.0  # from the driver's death to its last sandbox worker's


def run_trial(trial: Trial, laneflow: Any, tmp_path: Path) -> Trial:
    root = tmp_path / f"trial-{trial.n}"
    root.mkdir()
    ws = workspace(root / f"ws-kill-{trial.n}")
    url = f"sqlite:///{root / 'runs.db'}"
    index_of = {item: i for i, item in enumerate(item for items in GROUPS.values() for item in items)}
    driver = laneflow.start(["run", str(ws), "make", "--store", url, "--quiet", "--step-workers", "0"], root / "run.log")
    try:
        # Given a driver whose step of the chosen group is running its script
        assert wait_until(lambda: any(item in naps_of(ws) for item in GROUPS[trial.group]), 90), (root / "run.log").read_text()
        db = open_store(url)
        [run] = db.list_runs("local")
        trial.run_id = run.id
        if trial.race:
            # When its completion races the driver's death: the driver frozen while the script
            # runs, the worker completes its attempt (and waits for the engine to hear it)
            os.kill(driver, signal.SIGSTOP)
            running = [a for _, a in db.running_attempts("local")]
            assert running, "no attempt was running"
            assert wait_until(
                lambda: all(db.get_attempt("local", run.id, a.index, a.n).status == AttemptStatus.completed for a in running), 30
            ), "the worker did not complete its attempt while its driver was frozen"
            trial.raced = {a.index for a in running}
        else:
            time.sleep(trial.delay_s)
        # When the driver is killed
        before, seen = naps_of(ws), time.monotonic()
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended already: the body's error says why
            os.kill(driver, signal.SIGKILL)
        code = laneflow.wait(driver)
    died = time.monotonic()
    assert code == -signal.SIGKILL, (root / "run.log").read_text()[-2000:]
    if not trial.race:
        # A script with a good part of its nap still to go as the driver died: its step could
        # not have ended by then, so its worker must end nothing.
        trial.mid_script = {index_of[item] for item, (_, ran) in before.items() if ran + died - seen < NAP_S - 0.25}
    # Then its sandbox workers go at once, and so do their scripts
    workers = {local_pid(a) for _, a in db.running_attempts("local") if a.worker is not None}
    assert wait_until(lambda: all(gone(pid) for pid in workers), 10), "a sandbox worker outlived its driver"
    trial.worker_gone_s = time.monotonic() - died
    assert wait_until(lambda: not naps_of(ws), 10), "a script outlived its sandbox worker"
    trial.unfinished = [a for _, a in db.running_attempts("local")]
    assert not [a for a in db.list_attempts("local", run.id) if a.status == AttemptStatus.failed], "an attempt ended failed"

    # When reconcile runs
    reconciled = laneflow.start(["reconcile", "--store", url, "--json"], root / "reconcile.log")
    assert laneflow.wait(reconciled) == 0, (root / "reconcile.log").read_text()[-2000:]
    report = json.loads([line for line in (root / "reconcile.log").read_text().splitlines() if line.startswith("{")][-1])
    assert report["redriven"] == [run.id]
    outcomes = {(a["index"], a["attempt"]): a["outcome"] for a in report["attempts"]}
    assert outcomes == {(a.index, a.n): "interrupted" for a in trial.unfinished}
    check_trial(trial, db)
    return trial


def check_trial(trial: Trial, db: Store) -> None:
    run = db.get_run("local", trial.run_id, detail=True)
    assert run.status == RunStatus.completed, run.error
    assert run.drives == 2
    assert_invariants(db, run)
    unfinished = {a.index for a in trial.unfinished}
    assert trial.mid_script <= unfinished, (
        f"a worker ended the attempt its script was running for: steps {trial.mid_script - unfinished}"
    )
    assert not trial.raced & unfinished
    for step in run.steps:
        attempts = db.list_attempts("local", run.id, step.index)
        assert step.status == StepStatus.completed and step.result == f"Made {step.item}."
        assert [a.status for a in attempts].count(AttemptStatus.completed) == 1
        assert all(
            a.status == AttemptStatus.interrupted and a.reason == INTERRUPTED
            for a in attempts
            if a.status != AttemptStatus.completed
        )
        # Its script's work was done once: an attempt killed mid-script recorded no tool call.
        assert [data_of(e)["tool"] for e in step.events if e.type == "tool"] == ["script_nap"]
        if step.index in unfinished:
            assert step.attempts == 2
            retried = [e for e in step.events if e.type == "attempt"][-1]
            assert data_of(retried)["told"] == [INTERRUPTED]
        else:
            assert step.attempts == 1  # completed before the kill (or as the driver died): carried, not redone


def test_a_driver_killed_while_a_sandboxed_script_runs_leaves_it_interrupted_and_reconcile_finishes_the_run(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    trials = [Trial(n, race=n % 5 == 4, group=rng.choice(sorted(GROUPS)), delay_s=rng.uniform(0.05, 0.35)) for n in range(TRIALS)]
    done: list[Trial] = []
    errors: list[BaseException] = []
    warm = [WarmParent() for _ in range(LANES)]

    def lane(k: int) -> None:
        try:
            for trial in trials[k::LANES]:
                command = ConsoleScript() if trial.n == 0 else warm[k]
                done.append(run_trial(trial, command, tmp_path))
        except BaseException as error:  # raised on the test's thread below
            errors.append(error)

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(LANES)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
    finally:
        for parent in warm:
            parent.close()
    if errors:
        raise errors[0]
    assert len(done) == TRIALS
    assert sum(bool(t.mid_script) for t in done) >= TRIALS // 2  # most kills came while a script had a good part to go
    assert sum(bool(t.raced) for t in done) == TRIALS // 5
    assert {t.group for t in done} == set(GROUPS)
    slowest = max(t.worker_gone_s for t in done)
    assert slowest < 5.0
    print(f"\n{TRIALS} drivers killed; their last sandbox worker gone within {slowest * 1000:.0f} ms at most")


def test_a_lead_whose_reply_begins_after_its_driver_was_killed_is_interrupted_not_failed(tmp_path: Path) -> None:
    """The lead of a gated lane releases its waiting sibling through the engine's relay when
    its reply begins; its driver was killed just before. The relay is closed: the lead's
    worker goes, leaving its attempt to reconcile (it used to end it failed, "the engine
    closed the relay")."""
    ws = tmp_path / "ws-late-reply"
    (ws / "agents" / "maker").mkdir(parents=True)
    (ws / "agents" / "maker" / "agent.md").write_text(
        '---\nsandbox: true\nstub: "ttft_ms: 1200\\nMade {item}."\n---\nYou make.\n'
    )
    (ws / "flows").mkdir()
    (ws / "flows" / "make.yaml").write_text(
        "steps:\n  - agent: maker\n    each: [a, b]\n    parallel: 2\n    instruction: Make {item}.\n"
    )
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nBe brief.\n")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    warm = WarmParent()
    try:
        driver = warm.start(["run", str(ws), "make", "--store", url, "--quiet", "--step-workers", "0"], tmp_path / "run.log")
        try:
            assert wait_until(lambda: (tmp_path / "runs.db").exists(), 60)
            db = open_store(url)
            assert wait_until(lambda: any(a.index == 0 for _, a in db.running_attempts("local")), 60), stacks(
                driver, tmp_path / "run.log"
            )
            time.sleep(0.8)  # its reply begins 1.2 s into the attempt
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have ended already: the body's error says why
                os.kill(driver, signal.SIGKILL)
            code = warm.wait(driver)
        assert code == -signal.SIGKILL, (tmp_path / "run.log").read_text()[-2000:]
        [lead] = [a for _, a in db.running_attempts("local") if a.index == 0]
        assert wait_until(lambda: gone(local_pid(lead)), 10)
        time.sleep(1.0)  # past the moment its reply would have begun
        [run] = db.list_runs("local")
        assert db.get_attempt("local", run.id, 0, 1).status == AttemptStatus.running  # nothing ended it
        reconciled = warm.start(["reconcile", "--store", url, "--json"], tmp_path / "reconcile.log")
        assert warm.wait(reconciled) == 0, (tmp_path / "reconcile.log").read_text()[-2000:]
    finally:
        warm.close()
    run = db.get_run("local", run.id)
    assert run.status == RunStatus.completed, run.error
    assert_invariants(db, run)
    first = db.list_attempts("local", run.id, 0)
    assert [(a.status, a.reason) for a in first] == [(AttemptStatus.interrupted, INTERRUPTED), (AttemptStatus.completed, None)]
