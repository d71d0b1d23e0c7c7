"""The trace: events, model-call spans, prompt layers, and values of any size."""

from __future__ import annotations

import pytest

from contract.store.backends import TENANT, big_text, claim, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.records import AttemptStatus, Event, ModelCall, PromptLayer, StepChanges, StepStatus, Tokens


def test_events_are_kept_in_the_order_written(store: Store) -> None:
    run = new_run(store)
    texts = [f"line {i}" for i in range(12)]
    for text in texts:
        store.add_event(run.tenant, run.id, 1, Event(text=text, t="2026-01-01T00:00:00.000Z"))
    assert [e.text for e in store.get_run(run.tenant, run.id).step(1).events] == texts


def test_an_event_written_with_an_attempt_carries_its_number(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.add_event(run.tenant, run.id, 0, Event(text="tool call", type="tool", attempt=7, data={"tool": "search"}), attempt=ref)  # type: ignore[arg-type]
    (event,) = store.get_step(run.tenant, run.id, 0, detail=True).events
    assert (event.attempt, event.type, event.data) == (1, "tool", {"tool": "search"})


def test_put_call_twice_with_the_same_id_keeps_one_updated_span_and_spans_are_ordered_by_n(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.put_call(ref, ModelCall(id="turn-2", n=2, ms=10))
    store.put_call(ref, ModelCall(id="turn-1", n=1, ms=100, tokens=Tokens(input=1)))
    store.put_call(ref, ModelCall(id="turn-1", n=1, ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300), stop="end_turn"))

    calls = store.get_step(run.tenant, run.id, 0, detail=True).calls
    assert [c.id for c in calls] == ["turn-1", "turn-2"]
    assert (calls[0].ms, calls[0].ttft_ms, calls[0].tokens.output, calls[0].stop) == (812, 390, 300, "end_turn")


def test_set_prompt_layers_replaces_the_layers_of_the_step(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.set_prompt_layers(
        ref, [PromptLayer(name="persona", chars=1, sha256="aa"), PromptLayer(name="task", chars=2, sha256="bb")]
    )
    store.set_prompt_layers(ref, [PromptLayer(name="input", chars=3, sha256="cc", dynamic=True)])
    assert store.get_step(run.tenant, run.id, 0, detail=True).prompt_layers == [
        PromptLayer(name="input", chars=3, sha256="cc", dynamic=True)
    ]


def test_add_event_rejects_an_attempt_of_another_step(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(ValueError):
        store.add_event(run.tenant, run.id, 1, Event(text="wrong step"), attempt=ref)
    assert snapshot(store, run) == before


def test_large_values_round_trip_exactly(store: Store) -> None:
    # Given a run whose input, instruction, result, conclusion, data, trace, handoff and
    # attempt reason are each larger than a blob threshold
    big = {
        name: big_text(seed=name)
        for name in ("input", "event", "row", "stop", "handoff", "result", "conclusion", "reason", "instruction")
    }
    data = {"rows": [big["row"]]}
    run = new_run(store, input={"document": big["input"]}, steps=2)
    _, ref = claim(store, run, 0)
    store.add_event(TENANT, run.id, 0, Event(text=big["event"], data=data), attempt=ref)
    store.put_call(ref, ModelCall(id="turn-1", stop=big["stop"]))
    store.put_handoff(TENANT, run.id, "g1c0:results", big["handoff"])
    store.end_attempt(
        ref,
        AttemptStatus.completed,
        reason=big["reason"],
        step=StepChanges(status=StepStatus.completed, result=big["result"], conclusion=big["conclusion"], data=data),
    )
    store.update_step(TENANT, run.id, 1, StepChanges(instruction=big["instruction"]))

    # When it is read back, every value is exactly what was written
    after = store.get_run(TENANT, run.id)
    step = after.step(0)
    assert after.input == {"document": big["input"]}
    assert (step.result, step.conclusion, step.data) == (big["result"], big["conclusion"], data)
    assert (step.events[0].text, step.events[0].data, step.calls[0].stop) == (big["event"], data, big["stop"])
    assert after.step(1).instruction == store.get_step(TENANT, run.id, 1).instruction == big["instruction"]
    assert store.get_handoff(TENANT, run.id, "g1c0:results") == big["handoff"]
    assert store.get_attempt(TENANT, run.id, 0, 1).reason == big["reason"]
