"""Readied siblings: on the embedded engine, a sibling waiting at its lane's gate is started
while its lead is in flight, and only its first model request waits for the lead's reply.

A released sibling's start used to be the engine's and its worker's work after the lead's
first event: the interpreter resuming its Map iteration, the RunSibling call crossing to a
worker, the claim, the workspace read, the prompt, the SDK building the request. At a
fan-out of 100 on two cores that put the last sibling's request 490-567 ms after the lead's
first event, against 8-13 ms for the same requests written as prebuilt bytes. So when
WaitForLead says a sibling waits (`waiting: true`), the engine calls RunStep for it at once,
as its RunSibling state will (the same payload and operation id: the state's name, the map
index, retry 0), with `hold` naming its gate: the attempt is claimed and everything up to the
model request is done, and the request waits in its process (adapters/engine/held.py) until
the gate's release. When the interpreter reaches RunSibling, that call is answered by the
readied one's answer instead of a second invocation.

Not readied: the reserve (it waits for the lead to end, not for its reply), a sandboxed
lane's siblings (their Task is a container), the stub's lanes (its pretend cache is its
process's, and it has no request to hold), and everything with LANEFLOW_READY_SIBLINGS=0. In
the cloud nothing is readied: a sibling waiting there holds no Lambda, as DESIGN says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from laneflow.adapters.engine import held
from laneflow.domain.gate import is_reserve
from laneflow.domain.lanes import gate_key
from laneflow.domain.messages import LaneKey

SIBLING_STATE = "RunSibling"  # the definition's Task a released sibling runs (statemachines/flow.asl.json)

UNTAKEN_S = 300.0  # a readied call whose RunSibling never came (its run stopped meanwhile) is forgotten after this

Invoke = Callable[[str, Any], dict[str, Any]]


def readied_payload(payload: Any) -> dict[str, Any] | None:
    """RunSibling's payload for a sibling WaitForLead was called for, with its gate as `hold`;
    None when it is not one to ready (see the module docstring)."""
    if not isinstance(payload, dict) or not payload.get("execution"):
        return None  # a sandboxed lane's wait (it names no execution): its sibling is a container
    step, run, lane = payload.get("step") or {}, payload.get("run") or {}, payload.get("lane")
    if step.get("role") != "sibling" or not isinstance(lane, str) or "@" not in lane:
        return None
    if LaneKey.parse(lane).model == "stub" or is_reserve(payload.get("map_index"), payload.get("parallel")):
        return None
    group, cycle = int(payload["group"]), int(payload.get("cycle") or 0)
    return {
        "run": run,
        "group": group,
        "cycle": cycle,
        "lane": lane,
        "step": step,
        "op": {"execution": payload["execution"], "state": SIBLING_STATE, "map_index": payload.get("map_index"), "retry": 0},
        "hold": held.gate_id(str(run.get("tenant")), str(run.get("run_id")), gate_key(group, cycle, lane)),
    }


def _key(payload: Any) -> tuple[str, str, int, str] | None:
    if not isinstance(payload, dict):
        return None
    op, run, step = payload.get("op") or {}, payload.get("run") or {}, payload.get("step") or {}
    if op.get("state") != SIBLING_STATE or op.get("retry"):
        return None
    return (str(run.get("run_id")), str(op.get("execution")), int(step.get("index", -1)), str(op.get("map_index")))


def waiting(answer: dict[str, Any]) -> bool:
    body = answer.get("Payload")
    return not answer.get("FunctionError") and isinstance(body, dict) and body.get("waiting") is True


class EarlyStarts:
    """The readied siblings' RunStep calls in flight, by run, execution, step and map index,
    until their RunSibling states take their answers."""

    def __init__(self, invoke: Invoke, function: str):
        self.invoke, self.function = invoke, function
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, str, int, str], Future[dict[str, Any]]] = {}
        self._ended: dict[tuple[str, str, int, str], float] = {}  # when each call in _calls answered
        self.started = 0  # readied so far (tests, benchmarks)

    def _forget_untaken(self) -> None:
        now = time.monotonic()
        for key, at in list(self._ended.items()):
            if now - at > UNTAKEN_S:
                self._ended.pop(key, None)
                self._calls.pop(key, None)

    def after_wait(self, payload: Any, answer: dict[str, Any]) -> None:
        """WaitForLead answered for `payload`: ready its sibling if it waits."""
        if not waiting(answer):
            return
        call = readied_payload(payload)
        key = _key(call)
        if call is None or key is None:
            return
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._forget_untaken()
            if key in self._calls:
                return  # WaitForLead re-delivered: it is readied already
            self._calls[key] = future
            self.started += 1

        def run() -> None:
            try:
                future.set_result(self.invoke(self.function, call))
            except BaseException as error:  # the RunSibling state hears it as the call's own failure
                future.set_exception(error)
            with self._lock:
                if key in self._calls:
                    self._ended[key] = time.monotonic()

        threading.Thread(target=run, name=f"laneflow-ready-{key[2]}", daemon=True).start()

    def take(self, payload: Any) -> Future[dict[str, Any]] | None:
        """The readied call RunSibling's `payload` is, if its sibling was readied (never the
        readied call itself, which names its gate)."""
        key = _key(payload) if isinstance(payload, dict) and "hold" not in payload else None
        if key is None:
            return None
        with self._lock:
            self._ended.pop(key, None)
            return self._calls.pop(key, None)
