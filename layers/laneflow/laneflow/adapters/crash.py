"""The crash points that kill: what a process the crash-injection suite started is given
(LANEFLOW_CRASH_AT=NAME, or NAME:K for the K-th time the point is reached;
laneflow.usecases.crashpoints names the points).

At its point the process kills itself with SIGKILL, as a worker that dies would: no
cleanup, no finally blocks. In a step worker of the embedded engine (LANEFLOW_ENGINE_WORKER
names the engine's process, whose attempts it runs), the engine's process is killed first,
then the worker, as when the machine's one runner dies.
"""

from __future__ import annotations

import json
import os
import signal
import threading

# How often each point was reached in this process: the K of NAME:K counts every pass of the
# process, whichever services passed it.
_lock = threading.Lock()

_hits: dict[str, int] = {}


class KillingCrashPoints:
    """`CrashPoints` that kill this process at the point `spec` names (`NAME` or `NAME:K`);
    `engine_worker` the engine's process (a LocalProcess as JSON) of a step worker."""

    def __init__(self, spec: str, engine_worker: str | None = None):
        self.spec = spec
        self.engine_worker = engine_worker

    def reached(self, name: str) -> None:
        target, _, nth = self.spec.partition(":")
        if target != name:
            return
        with _lock:
            _hits[name] = _hits.get(name, 0) + 1
            hit = _hits[name]
        if hit == int(nth or 1):
            if self.engine_worker:
                os.kill(int(json.loads(self.engine_worker)["pid"]), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
