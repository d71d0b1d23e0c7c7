"""Who works on an attempt or drives a run, and whether it is still there.

A worker reference (laneflow.domain.workers) is kept on the attempt and, for drives, on the
run. Whether it is still there depends on its kind:
- `LocalProcess`: alive while that process is (its start time guards against a reused pid);
- `LambdaRequest`: gone once past its deadline (and a grace);
- `StepFunctionsExecution`: gone once the execution is not RUNNING (asked of Step Functions
  by the caller's `execution_alive`);
- `FargateTask`: gone once the task stopped (asked of ECS by the caller's `task_alive`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution, WorkerRef
from laneflow.settings import settings

GRACE_S = 30.0  # past a Lambda's deadline, before its attempt counts as gone


def _process_stat(pid: int) -> tuple[str, str] | None:
    """A process's state and the kernel's start time of it (clock ticks since boot), or None
    if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), fields[19].decode()
    except (OSError, IndexError):
        return None


def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), or None if unknown."""
    stat = _process_stat(pid)
    return stat[1] if stat else None


@lru_cache(maxsize=1)
def local_worker() -> LocalProcess:
    engine = settings().engine_worker
    if engine:  # a step worker of the embedded engine: it works for the engine's process
        return LocalProcess.model_validate_json(engine)
    pid = os.getpid()
    return LocalProcess(host=socket.gethostname(), pid=pid, started=_process_start(pid))


def current_worker(context: Any = None) -> LocalProcess | LambdaRequest:
    """The worker an invocation runs on: the local process, or a Lambda (from its context)."""
    if context is None or getattr(context, "local", False):
        return local_worker()
    remaining = context.get_remaining_time_in_millis()
    return LambdaRequest(request_id=context.aws_request_id, deadline=time.time() + remaining / 1000)


def local_alive(worker: LocalProcess) -> bool | None:
    """On this host: is that process still running? On another host: unknown (None)."""
    if worker.host != socket.gethostname():
        return None
    pid = worker.pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _process_stat(pid)
    if stat is not None and stat[0] in ("Z", "X"):
        # Dead, its exit status not yet collected (its parent went first, or has not looked):
        # it does no work. A killed worker's parent may well have died with it.
        return False
    return worker.started is None or (stat is not None and stat[1] == worker.started)


class Liveness:
    """Tells whether a worker is still there: True, False, or None (cannot tell).

    `gone` names a worker known to be going away (a local runner that got SIGINT or SIGTERM
    tells reconcile's own rules about itself): it counts as gone while it is still alive."""

    def __init__(
        self,
        *,
        execution_alive: Callable[[str], bool | None] | None = None,
        task_alive: Callable[[str], bool | None] | None = None,
        task_gone_for: Callable[[str], str | None] | None = None,
        now: Callable[[], float] = time.time,
        gone: WorkerRef | None = None,
    ):
        self.execution_alive = execution_alive
        self.task_alive = task_alive
        self.task_gone_for = task_gone_for  # why a stopped task stopped, when for memory or an eviction
        self.now = now
        self.gone = gone

    def alive(self, worker: WorkerRef | None) -> bool | None:
        if worker is None:
            return None
        if self.gone is not None and worker.same(self.gone):
            return False
        match worker:
            case LocalProcess():
                return local_alive(worker)
            case LambdaRequest():
                return self.now() <= worker.deadline + GRACE_S
            case StepFunctionsExecution() if self.execution_alive:
                return self.execution_alive(str(worker.execution))
            case FargateTask() if self.task_alive:
                return self.task_alive(worker.task)
        return None

    def gone_for(self, worker: WorkerRef | None) -> str | None:
        """Why a worker that is gone went, when it was killed for memory or evicted (a sandbox
        task): its attempt's next one runs one size up. None for any other end."""
        if isinstance(worker, FargateTask) and self.task_gone_for is not None:
            return self.task_gone_for(worker.task)
        return None
