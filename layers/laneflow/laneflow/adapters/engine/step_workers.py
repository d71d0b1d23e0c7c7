"""Step workers: processes the embedded engine runs its steps in, beside its interpreter.

The embedded engine is one Python process, so its interpreter (moto's, a thread per Map
iteration and per Task) and every handler share one interpreter lock: a machine's second
core sits idle while a fan-out of stub steps runs. With `LANEFLOW_STEP_WORKERS=N`, the
RunStep function (a step's claim, prompt, model loop and writes: about half of a step's CPU)
is answered instead by one of N long-lived worker processes
(`python -m laneflow.entrypoints.step_worker`), as the Lambda service would run it in its
own sandbox. Every other function stays in the engine's process, and so does the
interpreter.

What crosses, and how:
- a call goes as one JSON line on its worker's stdin (`{"id", "function", "payload"}`), and
  its answer comes back as one line on its stdout (`{"id", "result"}`: exactly what the
  in-process handler registry would answer, a result or a Lambda function error). A worker
  runs each call on a thread of its own, as the engine would.
- which worker: a stub step's call goes to its run's worker (chosen by the run's id: the
  stub's pretend prompt cache is its process's, as a lane's cache is one account's); any
  other model's to the worker with the fewest calls in flight (its cache is the API's), so a
  released lane's siblings start on every worker at once instead of queueing for one
  interpreter lock.
- the callbacks a step makes (a lead releasing its siblings' gate) are relayed to the
  interpreter over the engine's 0600 Unix socket (`CallbackRelay`, as for sandbox workers).
- a worker's attempts are the engine process's own (`LANEFLOW_ENGINE_WORKER`): it works for
  that process and ends with it (its stdin closes, and it watches its parent), so reconcile's
  rule for a local worker that went away is unchanged.
- a worker that dies (a crash, a kill) fails every call it had with `StepWorkerExited`, which
  the definition retries and catches as a Lambda that died (StepCrashed), and is replaced.
- the engine's worker going away (Ctrl-C) is told to every worker (`leave`): its running
  steps see it as the in-process ones do.

The workers start with the drive, while its first states run; a call waits for its worker
to be ready (about half a second of imports), and one that did not start within 30 s is
answered in the engine's process. A `:memory:` store is per process, so it never uses
workers.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import zlib
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from laneflow.adapters.engine import held
from laneflow.adapters.engine.sandbox import CallbackRelay
from laneflow.adapters.workers import local_worker
from laneflow.domain.messages import LaneKey
from laneflow.domain.workers import ENGINE_WORKER
from laneflow.ports import TaskCallbacks

log = logging.getLogger("laneflow.engine")

WORKER_MODULE = "laneflow.entrypoints.step_worker"

START_TIMEOUT_S = 30.0  # a worker not ready by then: the engine answers its calls itself

CALL_TIMEOUT_S = 3600.0  # past a Lambda's 15 minutes: a worker that never answers is a bug, not a wait


def usable(store_url: str | None) -> bool:
    """Whether a worker process can reach the engine's store (a `:memory:` one is per process)."""
    return bool(store_url) and ":memory:" not in str(store_url)


def spreads(payload: Mapping[str, Any]) -> bool:
    """Whether a call may go to any worker: its lane's model keeps its prompt cache outside
    the process (any model but the stub, whose pretend cache is the process's). A call that
    names no lane's model (a rescue's: its lane is `rescue`) stays with its run's worker."""
    lane = payload.get("lane")
    return isinstance(lane, str) and "@" in lane and LaneKey.parse(lane).model != "stub"


def _exited(error: str) -> dict[str, Any]:
    return {
        "StatusCode": 200,
        "FunctionError": "Unhandled",
        "Payload": {"errorType": "StepWorkerExited", "errorMessage": error, "stackTrace": []},
    }


class _Worker:
    """One worker process, its calls in flight, and the thread reading its answers."""

    def __init__(self, environ: Mapping[str, str]):
        self.process = subprocess.Popen(  # our own interpreter and module
            [sys.executable, "-m", WORKER_MODULE],
            env=dict(environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a person's Ctrl-C is the engine's
        )
        self.ready = threading.Event()
        self.dead = threading.Event()
        self.pending: dict[int, Future[dict[str, Any]]] = {}
        self.answered = 0  # calls sent to it (tests, benchmarks)
        self.started = False  # it said it was ready (one that died before never could)
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name=f"step-worker-{self.process.pid}", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                message = json.loads(line)
                if "ready" in message:
                    self.started = True
                    self.ready.set()
                    continue
                with self._lock:
                    future = self.pending.pop(int(message["id"]), None)
                if future is not None:
                    future.set_result(message["result"])
        except (ValueError, KeyError, OSError) as error:
            log.warning("step worker %s: unreadable answer (%s); it is replaced", self.process.pid, error)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)  # its calls cannot be told apart any more
        self._died()

    def _died(self) -> None:
        with self._lock:
            self.dead.set()
            self.ready.set()  # whoever waits for it to start stops waiting (and finds it dead)
            pending, self.pending = self.pending, {}
        code = self.process.wait()
        for future in pending.values():
            future.set_result(_exited(f"the step worker (pid {self.process.pid}) exited with code {code} before it answered"))

    def in_flight(self) -> int:
        """Calls sent to it and not yet answered."""
        with self._lock:
            return len(self.pending)

    def send(self, message: dict[str, Any], future: Future[dict[str, Any]] | None = None) -> bool:
        """Write one line to the worker (False: it has died)."""
        assert self.process.stdin is not None
        with self._lock:
            if self.dead.is_set():
                return False
            if future is not None:
                self.pending[int(message["id"])] = future
                self.answered += 1
            try:
                self.process.stdin.write(json.dumps(message).encode() + b"\n")
                self.process.stdin.flush()
            except OSError:
                if future is not None:
                    self.pending.pop(int(message["id"]), None)
                return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()  # it ends when its stdin does
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class StepWorkers:
    """`size` worker processes answering one function's calls for the engine, with their
    callbacks relayed to `callbacks` (the interpreter's)."""

    def __init__(self, environ: Mapping[str, str], size: int, callbacks: TaskCallbacks):
        if size < 1:
            raise ValueError(f"{size} step workers answer nothing")
        self.relay = CallbackRelay(callbacks)
        self.environ = {
            **environ,
            "LANEFLOW_RELAY": self.relay.listen(),
            ENGINE_WORKER: local_worker().model_dump_json(),
            "LANEFLOW_STEP_WORKERS": "0",  # a worker runs its calls itself
        }
        self.size = size
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self.workers = [_Worker(self.environ) for _ in range(size)]
        held.listen(self.release)  # a lead's release, heard in the engine's process, is each worker's too

    def _pick(self, run_id: str, spread: bool = False) -> _Worker | None:
        """The worker for a call of this run: the run's own (chosen by its id), or with
        `spread` the one with the fewest calls in flight (the run's own on a tie); any dead
        one is replaced first. None: it did not start in time."""
        slot = zlib.crc32(run_id.encode()) % self.size
        with self._lock:
            if self._closed:
                return None
            for i, each in enumerate(self.workers):
                if each.dead.is_set() and not each.started:
                    # It could not start (a broken environment): none would. The engine
                    # answers every call itself from now on, and says so once.
                    log.warning(
                        "a step worker exited before it started (code %s): steps run in the engine's process", each.process.poll()
                    )
                    self._closed = True
                    return None
                if each.dead.is_set():
                    self.workers[i] = _Worker(self.environ)
            if spread:
                order = self.workers[slot:] + self.workers[:slot]
                # One that has started before one still importing, then the least busy.
                worker = min(order, key=lambda w: (not w.started, w.in_flight()))
            else:
                worker = self.workers[slot]
        return worker if worker.ready.wait(START_TIMEOUT_S) and not worker.dead.is_set() else None

    def invoke(self, function: str, payload: Any) -> dict[str, Any] | None:
        """The worker's answer to one call, or None when its worker could not take it (the
        caller answers it itself)."""
        call = payload if isinstance(payload, dict) else {}
        run_id = str((call.get("run") or {}).get("run_id") or "")
        worker = self._pick(run_id, spread=spreads(call))
        if worker is None:
            return None
        future: Future[dict[str, Any]] = Future()
        if not worker.send({"id": next(self._ids), "function": function, "payload": payload}, future):
            return None
        return future.result(CALL_TIMEOUT_S)

    def release(self, gate: str, replied: bool) -> None:
        """A gate's lead replied (or ended): the siblings readied in any worker go on."""
        for worker in list(self.workers):
            worker.send({"release": gate, "replied": replied})

    def leave(self) -> None:
        """The engine's worker is going away: every worker's running steps see it."""
        for worker in list(self.workers):
            worker.send({"leave": True})

    def close(self) -> None:
        held.unlisten(self.release)
        with self._lock:
            self._closed = True
            workers = list(self.workers)
        for worker in workers:
            worker.close()
        self.relay.close()


_pools: dict[tuple[int, str], StepWorkers] = {}

_pools_lock = threading.Lock()


def shared(environ: Mapping[str, str], size: int, callbacks: TaskCallbacks) -> StepWorkers:
    """The process's step workers for this environment and size (`laneflow serve` makes an
    engine per drive; they share one pool, started once)."""
    key = (size, json.dumps(sorted(environ.items())))
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = StepWorkers(environ, size, callbacks)
        return pool


def close_all() -> None:
    """End every pool's workers (tests; a process that exits ends them anyway)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
