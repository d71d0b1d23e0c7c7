"""A step worker of the embedded engine (`python -m laneflow.entrypoints.step_worker`).

Started by the engine when `LANEFLOW_STEP_WORKERS` is set (adapters/engine/step_workers.py):
it answers the calls the engine sends on stdin, one JSON line each
(`{"id", "function", "payload"}`), with the template's own handlers, each on a thread of its
own, and writes each answer as one line on stdout (`{"id", "result"}`). `{"leave": true}`
tells it the engine's worker is going away. Its callbacks go through the engine's relay
(`LANEFLOW_RELAY`); its store and settings are the engine's, from its environment. It ends
when its stdin closes or its engine goes away.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any


def main() -> int:
    from laneflow.adapters.engine import held
    from laneflow.adapters.engine.local import bound_malloc_arenas, release_free_memory
    from laneflow.entrypoints.sandbox_worker import watch_parent
    from laneflow.settings import environ
    from laneflow.wiring import step_worker_registry, step_worker_services

    watch_parent(os.getppid())
    bound_malloc_arenas()  # a thread per call, as serve's drives: the same C-heap rules
    # Its relay closing is its engine gone, as its stdin closing is: it leaves at once, and a
    # call that met the closed relay (a lead releasing its siblings) ends no attempt failed.
    svc = step_worker_services(environ(), engine_gone=lambda: os._exit(0))
    registry = step_worker_registry(svc)
    for logical_id in registry.worker_functions:
        registry.load(logical_id)  # imported before the first call, not during it
    if svc.settings.claude_configured:
        # Its Claude executor too (the SDK: about a second of imports), which a worker that
        # is given a model key will need: a lane spread over the workers met it in one
        # sibling's start, not in the worker's own.
        import laneflow.adapters.executors.anthropic  # noqa: F401
    # The answers own the real stdout; whatever else writes to stdout (a library's print)
    # goes to stderr, and cannot break a line of the protocol.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out_lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        line = json.dumps(message).encode() + b"\n"
        with out_lock:
            out.write(line)
            out.flush()

    in_flight = [0]
    count_lock = threading.Lock()

    def answer(call: dict[str, Any]) -> None:
        try:
            result = registry.invoke(str(call["function"]), call.get("payload"))
            say({"id": call["id"], "result": result})
        finally:
            with count_lock:
                in_flight[0] -= 1
                idle = in_flight[0] == 0
            if idle:  # a long-lived worker keeps none of what its calls freed (as serve after a drive)
                release_free_memory()

    say({"ready": os.getpid()})
    for line in sys.stdin.buffer:
        call = json.loads(line)
        if call.get("leave"):
            svc.leaving.set()
            continue
        if "release" in call:  # a lead's reply began: the siblings readied here send their requests
            held.release(str(call["release"]), replied=bool(call.get("replied")), tell=False)
            continue
        with count_lock:
            in_flight[0] += 1
        threading.Thread(target=answer, args=(call,), name=f"step-call-{call['id']}", daemon=True).start()
    # The engine is done: what still runs was for it, and it is gone.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
