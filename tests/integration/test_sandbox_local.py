"""Sandboxed steps on the embedded engine: the definition's sandbox state is answered by a
child process running the sandbox worker, which works in a scratch copy of the workspace
and relays its callbacks to the engine. On both stores (the DynamoDB one under moto, which
the child reaches through the test's moto server)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract.store.backends import BACKENDS
from helpers import error_of, local_pid, result_of, stderr_of

from laneflow.adapters.aws.s3 import ATTEMPTS
from laneflow.adapters.engine.local import DriveResult
from laneflow.domain.records import AttemptStatus, Run, RunStatus, StepStatus
from laneflow.domain.workers import LocalProcess
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


def workspace(root: Path, stub: str, *, sandbox: bool = True, fan_out: int = 1, parallel: int = 1) -> Path:
    ws = root / f"ws-sandbox-{uuid.uuid4().hex[:8]}"  # its scratch copies are named like it
    (ws / "agents" / "builder" / "outputs").mkdir(parents=True)
    (ws / "agents" / "builder" / "knowledge").mkdir()
    (ws / "knowledge").mkdir()
    (ws / "storage").mkdir()
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("Be brief.\n")
    (ws / "knowledge" / "style.md").write_text("plain\n")
    (ws / "agents" / "builder" / "agent.md").write_text(
        f"---\ndescription: builds\nsandbox: {'true' if sandbox else 'false'}\nstub: {json.dumps(stub)}\n---\nYou build.\n"
    )
    each = f"    each: {list(range(fan_out))}\n    parallel: {parallel}\n" if fan_out > 1 else ""
    (ws / "flows" / "build.yaml").write_text(f"steps:\n  - agent: builder\n{each}    instruction: Build {{item}}.\n")
    return ws


@pytest.fixture
def svc(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


def drive(svc: Services, ws: Path, flow: str = "build") -> DriveResult:
    run = create_run(svc, ws, flow, {})
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)


def test_a_sandboxed_stub_step_runs_whole_in_a_child_process_through_the_definition(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "built {item}")
    result = drive(svc, ws)
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    run = svc.store.get_run(result.run.tenant, result.run.id)
    assert run.status == RunStatus.completed
    (step,) = run.steps
    assert step.status == StepStatus.completed and result_of(step).startswith("built")
    (attempt,) = svc.store.list_attempts(run.tenant, run.id)
    assert isinstance(attempt.worker, LocalProcess) and attempt.worker.pid != os.getpid()
    assert any("sandbox worker" in e.text for e in step.events)
    history = local_engine(svc).history(result.execution_arn)
    assert any(e["type"] == "TaskSubmitted" and "ecs" in str(e) for e in history)


def test_an_unsandboxed_step_still_runs_in_this_process(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "plain", sandbox=False)
    result = drive(svc, ws)
    (attempt,) = svc.store.list_attempts(result.run.tenant, result.run.id)
    assert local_pid(attempt) == os.getpid()


STRAY = {
    "agents/builder/outputs/draft.md": "kept",
    "storage/deliverable.txt": "kept",
    "state/cursor.json": '{"n": 2}',
    "agents/builder/memory/learned.md": "kept",
    "knowledge/stray.md": "discarded",
    "agents/builder/knowledge/stray.md": "discarded",
    "agents/builder/agent.md": "---\nstub: rewritten\n---\nI rewrote myself.\n",
    "notes.txt": "discarded",
}


def scratch_copies(ws: Path) -> list[Path]:
    """Every scratch copy of `ws` there is now: in the attempts folder, and (a sandbox worker
    run as root keeps its copies on a tmpfs in a mount namespace of its own) as each process
    sees its attempts folder, through /proc/PID/root. Each copy once."""
    found: dict[tuple[int, int], Path] = {}
    places = [ATTEMPTS] + [Path(f"/proc/{pid}/root") / str(ATTEMPTS).lstrip("/") for pid in os.listdir("/proc") if pid.isdigit()]
    for place in places:
        try:
            for copy in place.glob(f"attempt-*/{ws.name}"):
                info = copy.stat()
                found.setdefault((info.st_dev, info.st_ino), copy)
        except OSError:
            continue  # a process that ended, or one this user may not look into
    return list(found.values())


class Scribbler:
    """Plays the step's programs: writes into every scratch copy of the workspace that
    appears while the step runs (the paths in STRAY), so what is kept can be checked."""

    def __init__(self, ws: Path) -> None:
        self.ws, self.done = ws, threading.Event()
        self.seen: set[Path] = set()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.is_set():
            for copy in scratch_copies(self.ws):
                if copy in self.seen or not (copy / "agents" / "builder" / "agent.md").is_file():
                    continue
                time.sleep(0.05)  # the copy is complete once its agent is there
                for rel, text in STRAY.items():
                    (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                    (copy / rel).write_text(text)
                self.seen.add(copy)
            time.sleep(0.02)

    def __enter__(self) -> Scribbler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def test_a_completed_sandboxed_attempt_keeps_only_its_outputs_memory_storage_and_state(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ttft_ms: 1500\nbuilt {item}")
    before = (ws / "agents" / "builder" / "agent.md").read_text()
    with Scribbler(ws) as scribbler:
        result = drive(svc, ws)
    assert result.run.status == RunStatus.completed and scribbler.seen
    for rel in (
        "agents/builder/outputs/draft.md",
        "storage/deliverable.txt",
        "state/cursor.json",
        "agents/builder/memory/learned.md",
    ):
        assert (ws / rel).read_text() == STRAY[rel], rel
    assert not (ws / "knowledge" / "stray.md").exists()
    assert not (ws / "agents" / "builder" / "knowledge" / "stray.md").exists()
    assert not (ws / "notes.txt").exists()
    assert (ws / "agents" / "builder" / "agent.md").read_text() == before  # an agent cannot rewrite itself
    assert not scratch_copies(ws), "the scratch copy is removed"
    kept = [e for e in result.run.steps[0].events if e.text.startswith("kept in the workspace")]
    assert kept and "knowledge" not in kept[0].text


def test_a_failed_sandboxed_attempt_keeps_nothing(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ttft_ms: 1200\nfail: the build broke")
    with Scribbler(ws) as scribbler:
        result = drive(svc, ws)
    assert result.run.steps[0].status == StepStatus.failed and scribbler.seen
    for rel in STRAY:
        if rel != "agents/builder/agent.md":
            assert not (ws / rel).exists(), rel
    assert not scratch_copies(ws)
    assert {a.status for a in svc.store.list_attempts(result.run.tenant, result.run.id)} == {AttemptStatus.failed}


def test_a_sandboxed_lead_opens_its_siblings_gate_through_the_relay(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ttft_ms: 300\nbuilt {item}", fan_out=3, parallel=3)
    result = drive(svc, ws)
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    steps = svc.store.get_run(result.run.tenant, result.run.id).steps
    assert [s.status for s in steps] == [StepStatus.completed] * 3
    pids = {local_pid(a) for a in svc.store.list_attempts(result.run.tenant, result.run.id)}
    assert len(pids) == 3 and os.getpid() not in pids  # each step in its own child
    lead_began = steps[0].calls[0].at
    for sibling in steps[1:]:
        assert any("waiting for the first builder step" in e.text for e in sibling.events)
        assert (
            sibling.started_at is not None and sibling.started_at >= lead_began
        )  # released by the lead's reply, relayed from its child


def _running_child(svc: Services, run_id: str, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, attempt in svc.store.running_attempts():
            if attempt.run_id == run_id and attempt.worker is not None and local_pid(attempt) != os.getpid():
                return local_pid(attempt)
        time.sleep(0.05)
    raise AssertionError("no sandboxed attempt started")


def _drive_in_thread(svc: Services, ws: Path) -> tuple[Run, threading.Thread, dict[str, DriveResult]]:
    run = create_run(svc, ws, "build", {})
    out: dict[str, DriveResult] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)))
    thread.start()
    return run, thread, out


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[1].split()[0] == "Z"


def test_a_sandbox_worker_that_dies_is_caught_as_a_crashed_step_like_a_lambda(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ttft_ms: 30000\nnever")
    (ws / "flows" / "build.yaml").write_text("steps:\n  - agent: builder\n    retries: 0\n    instruction: Build.\n")
    run, thread, out = _drive_in_thread(svc, ws)
    pid = _running_child(svc, run.id)
    with open(f"/proc/{pid}/stat") as fh:
        parent = int(fh.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{parent}/cmdline", "rb") as fh:
        assert b"--zygote" in fh.read()  # forked by the warm worker, not a fresh interpreter
    os.kill(pid, 9)
    thread.join(60)
    assert not thread.is_alive()
    (step,) = svc.store.get_run(run.tenant, run.id).steps
    assert step.status == StepStatus.failed and "SandboxWorkerExited" in (step.error or "")
    assert {a.status for a in svc.store.list_attempts(run.tenant, run.id)} <= {AttemptStatus.failed, AttemptStatus.interrupted}


def test_a_stop_ends_the_sandbox_worker_and_its_attempt(svc: Services, tmp_path: Path) -> None:
    from laneflow.usecases.stop import stop_run

    ws = workspace(tmp_path, "ttft_ms: 60000\nnever")
    run, thread, out = _drive_in_thread(svc, ws)
    pid = _running_child(svc, run.id)
    stop_run(svc, run.tenant, run.id)
    thread.join(30)  # its model call takes 60 s: ended within this bound, the stop ended it
    assert not thread.is_alive(), "the stop did not end the step"
    assert _gone(pid)
    stored = svc.store.get_run(run.tenant, run.id)
    assert stored.status.ended and stored.stop_requested
    assert [a.status for a in svc.store.list_attempts(run.tenant, run.id)] == [AttemptStatus.stopped]


def test_ctrl_c_of_laneflow_run_ends_the_sandbox_worker_and_leaves_its_attempt_interrupted(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from laneflow.adapters.store import open_store
    from laneflow.usecases.reconcile import INTERRUPTED

    ws = workspace(tmp_path, "ttft_ms: 60000\nnever")
    store_url = f"sqlite:///{tmp_path / 'int.db'}"
    exe = Path(sys.executable).parent / "laneflow"
    proc = subprocess.Popen(
        [str(exe), "run", str(ws), "build", "--store", store_url, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline, pid, db = time.monotonic() + 60, None, None
        while pid is None and time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "int.db").exists():
                db = db or open_store(store_url)
                running = [a for _, a in db.running_attempts("local")]
                pid = local_pid(running[0]) if running and running[0].worker else None
            time.sleep(0.05)
        assert pid and pid != proc.pid, stderr_of(proc) if proc.poll() is not None else "no sandboxed attempt"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), "the sandbox worker outlived its engine"
    assert db is not None, "the store was never opened"
    (attempt,) = db.list_attempts("local", db.list_runs("local")[0].id)
    assert attempt.status == AttemptStatus.interrupted and attempt.reason == INTERRUPTED


def test_a_sandboxed_rescue_runs_through_the_rescue_choice_in_a_child(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "rescued it")
    (ws / "agents" / "breaker").mkdir()
    (ws / "agents" / "breaker" / "agent.md").write_text('---\nstub: "fail: it broke"\n---\nYou break.\n')
    (ws / "flows" / "rescue.yaml").write_text(
        "steps:\n  - agent: breaker\n    retries: 0\n    on_fail: builder\n    instruction: Try.\n"
    )
    result = drive(svc, ws, "rescue")
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    run = svc.store.get_run(result.run.tenant, result.run.id)
    assert run.options["sandboxed"] == ["builder"]  # recorded as the run started: its rescuer too
    rescue = next(s for s in run.steps if s.rescue_of is not None)
    assert rescue.status == StepStatus.completed and rescue.result == "rescued it"
    (attempt,) = svc.store.list_attempts(run.tenant, run.id, rescue.index)
    assert local_pid(attempt) != os.getpid()
    (breaker,) = svc.store.list_attempts(run.tenant, run.id, 0)
    assert local_pid(breaker) == os.getpid()  # the unsandboxed step ran in the engine's process
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in local_engine(svc).history(result.execution_arn)
        if "stateEnteredEventDetails" in e
    ]
    assert "RescueSandboxed" in entered and "SandboxRescue" in entered and "RunRescue" not in entered


def test_an_agent_made_sandboxed_after_its_run_started_is_refused_outside_a_sandbox(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ran", sandbox=False)
    run = create_run(svc, ws, "build", {})
    agent_md = ws / "agents" / "builder" / "agent.md"
    agent_md.write_text(agent_md.read_text().replace("sandbox: false", "sandbox: true"))
    result = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
    (step,) = svc.store.get_run(result.run.tenant, result.run.id).steps
    assert step.status == StepStatus.failed and "this worker is not one" in error_of(step)
    assert step.attempts == 1  # not retried: it is the agent's doing, not the worker's


def test_quick_sandboxed_steps_one_after_another_never_wait_on_each_others_exits(svc: Services, tmp_path: Path) -> None:
    # A worker can end (and the warm worker say so) before the engine has its pid from the
    # fork's answer: that exit must not block the answer, nor fail a token it completed.
    ws = workspace(tmp_path, "built {item}", fan_out=6, parallel=1)
    started = time.monotonic()
    result = drive(svc, ws)
    assert time.monotonic() - started < 20
    run = svc.store.get_run(result.run.tenant, result.run.id)
    assert [s.status for s in run.steps] == [StepStatus.completed] * 6
    assert not [e for s in run.steps for e in s.events if "SandboxWorkerExited" in e.text]
    failed = [e for e in local_engine(svc).history(result.execution_arn) if e["type"] in ("TaskFailed", "ExecutionFailed")]
    assert not failed
