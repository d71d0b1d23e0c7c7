"""The engine's end of a step worker (adapters/engine/step_workers.py), against stand-in
worker programs: a worker that breaks the protocol or dies fails its calls as a worker
that exited (never hangs them) and is killed; a call before its worker is ready waits."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.engine import step_workers


class Quiet:
    def succeed(self, token: str, output: dict[str, Any]) -> None: ...
    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        return []

    def fail(self, token: str, error: str, cause: str) -> None: ...
    def heartbeat(self, token: str) -> None: ...


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> dict[str, str]:
    """Workers run `body` (a Python program) instead of the real entrypoint."""
    (tmp_path / "stand_in_worker.py").write_text(textwrap.dedent(body))
    monkeypatch.setattr(step_workers, "WORKER_MODULE", "stand_in_worker")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def answered(answer: dict[str, Any] | None) -> dict[str, Any]:
    """A worker's answer to a call, asserting its worker took the call."""
    assert answer is not None, "no worker took the call"
    return answer


def test_a_worker_that_writes_garbage_fails_its_call_as_exited_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stand_in(
        tmp_path,
        monkeypatch,
        """
        import sys, time
        print('{"ready": 1}', flush=True)
        sys.stdin.readline()
        print("hello from a library", flush=True)
        time.sleep(600)
    """,
    )
    pool = step_workers.StepWorkers(env, 1, Quiet())
    try:
        answer = pool.invoke("RunStepFunction", {"run": {"run_id": "run-1"}})
        assert (
            answer is not None and answer["FunctionError"] == "Unhandled" and answer["Payload"]["errorType"] == "StepWorkerExited"
        )
        (worker,) = pool.workers
        # Killed, not waited for: its 600 s sleep would have ended it with 0
        assert worker.dead.is_set() and worker.process.poll() == -signal.SIGKILL
    finally:
        pool.close()


def test_a_worker_that_dies_mid_call_fails_it_and_the_next_call_gets_a_new_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stand_in(
        tmp_path,
        monkeypatch,
        """
        import json, os, sys
        print('{"ready": 1}', flush=True)
        call = json.loads(sys.stdin.readline())
        if os.environ.get("DIE_FIRST") and not os.path.exists(os.environ["DIE_FIRST"]):
            open(os.environ["DIE_FIRST"], "w").close()
            os._exit(3)
        print(json.dumps({"id": call["id"], "result": {"StatusCode": 200, "Payload": {"ok": True}}}), flush=True)
        sys.stdin.readline()
    """,
    )
    env["DIE_FIRST"] = str(tmp_path / "died-once")
    pool = step_workers.StepWorkers(env, 1, Quiet())
    try:
        first = pool.invoke("RunStepFunction", {"run": {"run_id": "run-1"}})
        assert (
            first is not None
            and first["Payload"]["errorType"] == "StepWorkerExited"
            and "code 3" in first["Payload"]["errorMessage"]
        )
        second = pool.invoke("RunStepFunction", {"run": {"run_id": "run-1"}})
        assert second == {"StatusCode": 200, "Payload": {"ok": True}}
    finally:
        pool.close()


def test_one_run_s_calls_go_to_one_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = stand_in(
        tmp_path,
        monkeypatch,
        """
        import json, os, sys
        print('{"ready": 1}', flush=True)
        for line in sys.stdin:
            call = json.loads(line)
            print(json.dumps({"id": call["id"], "result": {"Payload": {"pid": os.getpid()}}}), flush=True)
    """,
    )
    pool = step_workers.StepWorkers(env, 3, Quiet())
    try:
        pids = {answered(pool.invoke("F", {"run": {"run_id": "run-a"}}))["Payload"]["pid"] for _ in range(5)}
        assert len(pids) == 1
        every = {answered(pool.invoke("F", {"run": {"run_id": f"run-{i}"}}))["Payload"]["pid"] for i in range(30)}
        assert len(every) > 1  # runs spread over the workers
    finally:
        pool.close()


def test_a_pool_of_no_worker_is_refused() -> None:
    with pytest.raises(ValueError):
        step_workers.StepWorkers({}, 0, Quiet())


def test_a_worker_that_never_starts_is_not_waited_for_its_call_is_answered_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stand_in(
        tmp_path,
        monkeypatch,
        """
        raise SystemExit(5)
    """,
    )
    # Were its start waited for, each call would wait this long: the calls end well before
    monkeypatch.setattr(step_workers, "START_TIMEOUT_S", 600.0)
    pool = step_workers.StepWorkers(env, 1, Quiet())
    try:
        answers: list[object] = []
        calls = threading.Thread(target=lambda: answers.extend(pool.invoke("F", {"run": {"run_id": f"run-{n}"}}) for n in (1, 2)))
        calls.start()
        calls.join(60)
        assert not calls.is_alive(), "a call waited for a worker that had exited"
        assert answers == [None, None]  # the engine answers them itself
        assert len(pool.workers) == 1 and pool.workers[0].dead.is_set()  # not started again and again
    finally:
        pool.close()
