"""Who works on an attempt or drives a run, and whether it is still there (what reconcile asks).

A worker reference is a small JSON object kept on the attempt (and, for drives, on the run):
- local:   {"kind": "local", "host", "pid", "started"}: alive while that process is (the
           process start time guards against a reused pid);
- lambda:  {"kind": "lambda", "request_id", "deadline"}: gone once past its deadline;
- sfn:     {"kind": "sfn", "execution"}: gone once the execution is not RUNNING (asked of
           Step Functions by the caller's `execution_alive`);
- fargate: {"kind": "fargate", "task"}: gone once the task stopped (asked of ECS).
"""

from __future__ import annotations

import os
import socket
import time
from functools import lru_cache
from typing import Any, Callable

from laneflow.domain.workers import same_worker

GRACE_S = 30.0  # past a Lambda's deadline, before its attempt counts as gone



def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None



@lru_cache(maxsize=1)
def local_worker() -> dict[str, Any]:
    pid = os.getpid()
    return {"kind": "local", "host": socket.gethostname(), "pid": pid, "started": _process_start(pid)}



def current_worker(context: Any = None) -> dict[str, Any]:
    """The worker an invocation runs on: the local process, or a Lambda (from its context)."""
    if context is None or getattr(context, "local", False):
        return dict(local_worker())
    remaining = context.get_remaining_time_in_millis()
    return {"kind": "lambda", "request_id": context.aws_request_id, "deadline": time.time() + remaining / 1000}



def local_alive(worker: dict[str, Any]) -> bool | None:
    """On this host: is that process still running? On another host: unknown (None)."""
    if worker.get("host") != socket.gethostname():
        return None
    pid = int(worker.get("pid", 0))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = worker.get("started")
    return started is None or _process_start(pid) == started



class Liveness:
    """Tells whether a worker is still there: True, False, or None (cannot tell).

    `gone` names a worker known to be going away (a local runner that got SIGINT or SIGTERM
    tells reconcile's own rules about itself): it counts as gone while it is still alive."""

    def __init__(
        self,
        *,
        execution_alive: Callable[[str], bool | None] | None = None,
        task_alive=None,
        now=time.time,
        gone: dict[str, Any] | None = None,
    ):
        self.execution_alive = execution_alive
        self.task_alive = task_alive
        self.now = now
        self.gone = gone

    def alive(self, worker: dict[str, Any] | None) -> bool | None:
        if not worker:
            return None
        if self.gone and same_worker(worker, self.gone):
            return False
        kind = worker.get("kind")
        if kind == "local":
            return local_alive(worker)
        if kind == "lambda":
            return self.now() <= float(worker.get("deadline", 0)) + GRACE_S
        if kind == "sfn" and self.execution_alive:
            return self.execution_alive(str(worker.get("execution")))
        if kind == "fargate" and self.task_alive:
            return self.task_alive(str(worker.get("task")))
        return None
