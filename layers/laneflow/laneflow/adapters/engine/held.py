"""Held requests: a readied sibling's first model request waits here for its lead's reply.

On the embedded engine a sibling that waits at its lane's gate is readied while its lead is
in flight (adapters/engine/early.py): its attempt is claimed, its prompt built, its request
serialised, and only the request waits, on the gate's `release` in this process. A lead's
release reaches every process of the engine: it happens in the engine's (where every gate's
tokens are completed, LocalCallbacks) and is told to each step worker, which releases its own
here. A release that comes before the request begins to wait is remembered, so a sibling
readied late starts at once.

The gate's id is `tenant/run/gate key`: one lane of one group and cycle of one run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from laneflow.domain.lanes import gate_id

__all__ = ["gate_id", "listen", "release", "released", "unlisten", "wait"]

WAIT_S = 960.0  # as WaitForLead's TimeoutSeconds: past it the request goes anyway, as the definition's catch does

POLL_S = 0.25  # how often a waiting request looks for a stop

STOP_SEEN_S = 0.6  # past a step sink's stop watch (0.5 s): a stop recorded before a release is heard by then

KEPT = 20_000  # released gates remembered (about 100 bytes each); the oldest are forgotten first

_lock = threading.Lock()
_gates: dict[str, threading.Event] = {}
_ended: set[str] = set()  # gates released by their lead's end, not its reply (it failed, or was stopped)
_listeners: list[Callable[[str, bool], None]] = []


def _event(gate: str) -> threading.Event:
    with _lock:
        event = _gates.get(gate)
        if event is None:
            event = _gates[gate] = threading.Event()
            while len(_gates) > KEPT:
                _ended.discard(_gate := next(iter(_gates)))
                _gates.pop(_gate)
        return event


def release(gate: str, *, replied: bool = True, tell: bool = True) -> None:
    """The gate's lead replied (or, not `replied`, ended without a reply): its held requests
    go now. With `tell`, every listener (the step workers of this engine) hears it too."""
    event = _event(gate)
    if not replied:
        with _lock:
            _ended.add(gate)
    event.set()
    if tell:
        with _lock:
            listeners = list(_listeners)
        for listener in listeners:
            listener(gate, replied)


def listen(listener: Callable[[str, bool], None]) -> None:
    """`listener(gate)` is told every release made in this process."""
    with _lock:
        _listeners.append(listener)


def unlisten(listener: Callable[[str, bool], None]) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def released(gate: str) -> bool:
    return _event(gate).is_set()


def wait(gate: str, stopped: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Wait for the gate's release; True once released, False past `timeout_s`. `stopped()` is
    asked every POLL_S: when it says so, the wait ends (False) and the caller stops. A lead
    that ended without a reply may have ended for a stop, which a sink hears up to its
    watch's interval late (STOP_SEEN_S): then the wait lasts that long more, asking."""
    event = _event(gate)
    deadline = time.monotonic() + timeout_s
    while not event.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))):
        if stopped() or time.monotonic() >= deadline:
            return False
    with _lock:
        ended = gate in _ended
    if ended:
        heard = time.monotonic() + STOP_SEEN_S
        while time.monotonic() < heard:
            if stopped():
                return False
            time.sleep(0.05)
    return True
