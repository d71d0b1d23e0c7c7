"""Named crash points, for the crash-injection suite only.

`LANEFLOW_CRASH_AT=NAME` (or `NAME:K`, the K-th time it is reached) makes the process kill
itself with SIGKILL at that point of the step lifecycle, exactly as a worker that dies would:
no cleanup, no finally blocks. Unset, a crash point costs one dictionary lookup.

In a step worker of the embedded engine (`LANEFLOW_ENGINE_WORKER` names the engine's
process, whose attempts it runs), the point is the local runner's: the engine's process is
killed first, then the worker, as when the machine's one runner dies.
"""

from __future__ import annotations

import json
import os
import signal
import threading

from laneflow.domain.workers import ENGINE_WORKER

POINTS = (
    "after-journal",  # the claim was asked for (journal pending), before it landed
    "after-claim",  # the attempt is claimed, nothing has run
    "executor-started",  # the prompt is built, the executor is about to call the model
    "mid-model-call",  # the model's response has begun
    "after-result",  # the attempt's result is written, the group is not settled
    "group-transition",  # between groups: NextGroup is planning the next one
    "rescue-running",  # a rescue's attempt is running
    "parked",  # the run was just parked at an approval
)


_lock = threading.Lock()

_hits: dict[str, int] = {}


def crashpoint(name: str) -> None:
    spec = os.environ.get("LANEFLOW_CRASH_AT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name]
    if hit == int(nth or 1):
        engine = os.environ.get(ENGINE_WORKER)
        if engine:
            os.kill(int(json.loads(engine)["pid"]), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
