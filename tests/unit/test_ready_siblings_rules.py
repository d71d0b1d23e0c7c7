"""Which siblings the embedded engine readies at their gate, and how a held request waits:
a release before the wait lets it go at once, a stop ends the wait, a lead that ended
without a reply leaves time for its stop to be heard, and a gate never released times out."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from laneflow.adapters.engine import early, held
from laneflow.domain.lanes import gate_id, gate_key


def wait_payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "run": {"tenant": "t", "run_id": "r1"},
        "group": 2,
        "cycle": 1,
        "lane": "analyst@claude-sonnet-4-6",
        "step": {"index": 7, "role": "sibling"},
        "token": "tok",
        "map_index": 3,
        "parallel": 10,
        "execution": "arn:exec",
    }
    payload.update(changes)
    return payload


def test_a_waiting_sibling_is_readied_as_its_run_sibling_state_would_start_it() -> None:
    call = early.readied_payload(wait_payload())
    assert call is not None
    assert call["op"] == {"execution": "arn:exec", "state": early.SIBLING_STATE, "map_index": 3, "retry": 0}
    assert call["hold"] == gate_id("t", "r1", gate_key(2, 1, "analyst@claude-sonnet-4-6"))
    assert "token" not in call and call["step"] == {"index": 7, "role": "sibling"}


@pytest.mark.parametrize(
    "changes",
    [
        {"lane": "worker@stub"},  # the stub: nothing to hold
        {"map_index": 9, "parallel": 10},  # the reserve waits for the lead's end
        {"execution": None},  # a sandboxed lane's wait
        {"step": {"index": 0, "role": "lead"}},  # WaitForPrefix's lead
    ],
)
def test_what_is_never_readied(changes: dict[str, Any]) -> None:
    assert early.readied_payload(wait_payload(**changes)) is None


def test_the_run_sibling_call_takes_the_readied_answer_once_and_the_readied_call_never_takes_itself() -> None:
    calls: list[dict[str, Any]] = []
    done = threading.Event()

    def invoke(function: str, payload: Any) -> dict[str, Any]:
        calls.append(payload)
        assert starts.take(payload) is None  # the readied call itself is not RunSibling's
        done.set()
        return {"StatusCode": 200, "Payload": {"index": 7}}

    starts = early.EarlyStarts(invoke, "RunStep")
    starts.after_wait(wait_payload(), {"Payload": {"index": 7, "waiting": True}})
    starts.after_wait(wait_payload(), {"Payload": {"index": 7, "waiting": True}})  # a re-delivered wait
    assert done.wait(5)
    sibling = {k: v for k, v in calls[0].items() if k != "hold"}
    future = starts.take(sibling)
    assert future is not None and future.result(5) == {"StatusCode": 200, "Payload": {"index": 7}}
    assert starts.take(sibling) is None and len(calls) == 1 and starts.started == 1
    retried = {**sibling, "op": {**sibling["op"], "retry": 1}}
    starts.after_wait(wait_payload(step={"index": 8, "role": "sibling"}), {"Payload": {"index": 8, "waiting": True}})
    assert starts.take(retried) is None  # a retry is its own invocation


def test_a_sibling_that_did_not_wait_is_not_readied() -> None:
    starts = early.EarlyStarts(lambda f, p: pytest.fail("readied a sibling that did not wait"), "RunStep")
    starts.after_wait(wait_payload(), {"Payload": {"index": 7, "waiting": False}})
    starts.after_wait(wait_payload(), {"FunctionError": "Unhandled", "Payload": {"errorType": "X"}})
    assert starts.started == 0


def test_a_release_before_the_wait_lets_the_request_go_at_once() -> None:
    gate = gate_id("t", "early-release", "g0c0:a@m")
    held.release(gate, tell=False)
    started = time.monotonic()
    assert held.wait(gate, lambda: False, timeout_s=5)
    assert time.monotonic() - started < 0.2


def test_a_stop_ends_the_wait_and_a_gate_never_released_times_out() -> None:
    assert not held.wait(gate_id("t", "stopped", "k"), lambda: True, timeout_s=5)
    started = time.monotonic()
    assert not held.wait(gate_id("t", "never", "k"), lambda: False, timeout_s=0.3)
    assert time.monotonic() - started >= 0.3


def test_a_lead_ended_without_a_reply_leaves_its_stop_time_to_be_heard() -> None:
    gate = gate_id("t", "ended", "k")
    asked: list[float] = []
    released_at = time.monotonic()
    held.release(gate, replied=False, tell=False)

    def stopped() -> bool:  # the stop is heard 0.3 s after the release, as a sink's watch would
        asked.append(time.monotonic())
        return time.monotonic() - released_at > 0.3

    assert not held.wait(gate, stopped, timeout_s=5)
    assert asked, "the wait never asked whether the run was stopped"


def test_a_release_is_told_to_every_listener_with_whether_the_lead_replied() -> None:
    heard: list[tuple[str, bool]] = []

    def listener(gate: str, replied: bool) -> None:
        heard.append((gate, replied))

    held.listen(listener)
    try:
        held.release("t/r/a", replied=True)
        held.release("t/r/b", replied=False, tell=False)  # a worker's own release tells nobody
    finally:
        held.unlisten(listener)
    held.release("t/r/c")
    assert heard == [("t/r/a", True)]
