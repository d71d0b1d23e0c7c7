"""Attempts and their fences: claims, attempt numbers, endings, and every write that names an attempt."""

from __future__ import annotations

from typing import Any

import pytest

from contract.store.backends import LAMBDA, WORKERS, claim, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.errors import AttemptEnded, Conflict, NotFound
from laneflow.domain.records import (
    AttemptStatus,
    Event,
    ModelCall,
    PromptLayer,
    Step,
    StepChanges,
    StepStatus,
    Tokens,
    utcnow,
)


def test_claim_creates_attempt_1_running_and_sets_the_step_running(store: Store) -> None:
    run = new_run(store)
    attempt, _ = claim(store, run, 0, started_at="2026-03-03T00:00:00.000Z", op_id="exec:Map:0:0")

    assert (attempt.n, attempt.status, attempt.op_id) == (1, AttemptStatus.running, "exec:Map:0:0")
    assert store.get_attempt(run.tenant, run.id, 0, 1) == attempt
    assert store.list_attempts(run.tenant, run.id) == [attempt]
    step = store.get_step(run.tenant, run.id, 0)
    assert (step.status, step.attempts, step.started_at) == (StepStatus.running, 1, "2026-03-03T00:00:00.000Z")


def test_a_second_claim_while_an_attempt_runs_is_a_conflict_and_changes_nothing(store: Store) -> None:
    run = new_run(store)
    claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(Conflict):
        claim(store, run, 0, expect_status=[StepStatus.pending, StepStatus.running])
    assert snapshot(store, run) == before


def test_claim_is_refused_when_the_step_status_is_not_expected(store: Store) -> None:
    run = new_run(store, id="run-done")
    store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"step 0 of run 'run-done' is completed"):
        claim(store, run, 0)
    assert snapshot(store, run) == before


def test_a_missing_step_or_attempt_is_not_found(store: Store) -> None:
    run = new_run(store)
    with pytest.raises(NotFound):
        claim(store, run, 42)
    with pytest.raises(NotFound):
        store.get_attempt(run.tenant, run.id, 0, 1)
    with pytest.raises(NotFound):
        store.add_event(run.tenant, run.id, 42, Event(text="x"))


def test_end_attempt_with_the_exact_ref_ends_it_and_changes_its_step_together(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.end_attempt(
        ref,
        AttemptStatus.completed,
        reason="done",
        step=StepChanges(status=StepStatus.completed, result="the answer", cost_usd=0.25, finished_at="2026-04-04T00:00:00.000Z"),
    )
    attempt = store.get_attempt(run.tenant, run.id, 0, 1)
    assert (attempt.status, attempt.reason) == (AttemptStatus.completed, "done")
    assert attempt.ended_at is not None
    after = store.get_run(run.tenant, run.id)
    step = after.step(0)
    assert (step.status, step.result, step.cost_usd, step.finished_at) == (
        StepStatus.completed,
        "the answer",
        0.25,
        "2026-04-04T00:00:00.000Z",
    )
    assert after.cost_usd == 0.0  # the run's cost is what settling a group adds up


def test_ending_the_same_attempt_again_is_attempt_ended_and_changes_nothing(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.end_attempt(ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    before = snapshot(store, run)
    with pytest.raises(AttemptEnded):
        store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert snapshot(store, run) == before


@pytest.mark.parametrize(
    "wrong",
    [
        {"token": "not-the-token"},
        {"started_at": "1999-01-01T00:00:00.000Z"},
        {"resumed_at": "2026-05-05T00:00:00.000Z"},
        {"n": 2},
    ],
    ids=["token", "started_at", "resumed_at", "n"],
)
def test_a_ref_differing_in_any_part_of_its_identity_is_attempt_ended_and_changes_nothing(
    store: Store, wrong: dict[str, Any]
) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    bad = ref.model_copy(update=wrong)
    before = snapshot(store, run)
    with pytest.raises(AttemptEnded):
        store.end_attempt(bad, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    with pytest.raises(AttemptEnded):
        store.heartbeat(bad, utcnow())
    with pytest.raises(AttemptEnded):
        store.add_event(run.tenant, run.id, 0, Event(text="late"), attempt=bad)
    with pytest.raises(AttemptEnded):
        store.put_call(bad, ModelCall(id="c1"))
    with pytest.raises(AttemptEnded):
        store.set_prompt_layers(bad, [PromptLayer(name="persona", chars=1, sha256="aa")])
    assert snapshot(store, run) == before


def test_fenced_writes_after_the_attempt_ended_are_attempt_ended_and_not_stored(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.end_attempt(ref, AttemptStatus.interrupted, reason="worker went away", step=StepChanges(status=StepStatus.pending))
    before = snapshot(store, run)

    with pytest.raises(AttemptEnded):
        store.add_event(run.tenant, run.id, 0, Event(text="late line"), attempt=ref)
    with pytest.raises(AttemptEnded):
        store.put_call(ref, ModelCall(id="late-call"))
    with pytest.raises(AttemptEnded):
        store.set_prompt_layers(ref, [PromptLayer(name="late", chars=1, sha256="cc")])
    with pytest.raises(AttemptEnded):
        store.heartbeat(ref, utcnow())

    assert snapshot(store, run) == before


def test_a_late_write_from_attempt_1_never_lands_on_attempt_2(store: Store) -> None:
    # Given attempt 1 failed and attempt 2 claimed the step (a retry)
    run = new_run(store)
    first, ref1 = claim(store, run, 0, started_at="2026-07-07T00:00:00.000Z")
    store.end_attempt(ref1, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    second, ref2 = claim(
        store, run, 0, started_at="2026-07-07T00:01:00.000Z", expect_status=[StepStatus.pending, StepStatus.failed]
    )
    assert second.n == 2
    before = snapshot(store, run)

    # When attempt 1's worker, unaware, writes its ending, result and trace
    with pytest.raises(AttemptEnded):
        store.end_attempt(ref1, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="stale"))
    with pytest.raises(AttemptEnded):
        store.heartbeat(ref1, utcnow())
    with pytest.raises(AttemptEnded):
        store.add_event(run.tenant, run.id, 0, Event(text="stale"), attempt=ref1)
    with pytest.raises(AttemptEnded):
        store.put_call(ref1, ModelCall(id="stale"))
    with pytest.raises(AttemptEnded):
        store.set_prompt_layers(ref1, [PromptLayer(name="stale", chars=1, sha256="dd")])
    # A ref naming attempt 2's number with attempt 1's token/times is not attempt 2 either.
    with pytest.raises(AttemptEnded):
        store.end_attempt(ref1.model_copy(update={"n": 2}), AttemptStatus.completed)

    # Then nothing of it landed: attempt 2 still runs, untouched
    assert snapshot(store, run) == before
    assert store.get_attempt(run.tenant, run.id, 0, 2) == second
    step = store.get_step(run.tenant, run.id, 0)
    assert (step.status, step.attempts, step.started_at) == (StepStatus.running, 2, "2026-07-07T00:00:00.000Z")

    # And attempt 2's own writes land
    store.add_event(run.tenant, run.id, 0, Event(text="fresh"), attempt=ref2)
    store.end_attempt(ref2, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert [e.attempt for e in store.get_step(run.tenant, run.id, 0, detail=True).events] == [2]


def test_end_attempt_rejects_unknown_step_fields_and_the_attempt_keeps_running(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(ValueError):
        store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, agent="other"))  # type: ignore[call-arg]
    assert snapshot(store, run) == before
    assert store.get_attempt(run.tenant, run.id, 0, 1).status == AttemptStatus.running


def test_a_worker_of_every_kind_claimed_with_reads_back_as_it_was_written(store: Store) -> None:
    run = new_run(store, steps=len(WORKERS))
    for index, worker in enumerate(WORKERS):
        claim(store, run, index, worker=worker)
    assert [a.worker for a in store.list_attempts(run.tenant, run.id)] == WORKERS
    assert [type(store.get_attempt(run.tenant, run.id, i, 1).worker) for i in range(len(WORKERS))] == [type(w) for w in WORKERS]


def test_a_claim_writes_its_worker_and_the_steps_prompt_layers_with_it(store: Store) -> None:
    # Given a step created with prompt layers of its own
    created = [PromptLayer(name="persona", chars=1, sha256="00")]
    run = new_run(store, steps=1)
    store.add_steps(run.tenant, run.id, [Step(index=1, group=0, prompt_layers=created)])
    layers = [PromptLayer(name="persona", chars=10, sha256="aa"), PromptLayer(name="input", chars=3, sha256="bb", dynamic=True)]
    # When attempts are claimed with a worker and layers
    first, ref = claim(store, run, 1, worker=LAMBDA, layers=layers, op_id="op-1")
    # Then both are there at once, the layers as set_prompt_layers would leave them
    assert first.worker == LAMBDA
    assert store.get_attempt(run.tenant, run.id, 1, 1) == first
    assert store.get_step(run.tenant, run.id, 1, detail=True).prompt_layers == layers
    assert store.get_run(run.tenant, run.id).step(1).prompt_layers == layers
    # And a claim without them leaves the step's layers as they are, its attempt without a worker
    store.end_attempt(ref, AttemptStatus.failed, reason="model error", step=StepChanges(error="model error"))
    second, ref2 = claim(store, run, 1, expect_status=[StepStatus.running])
    assert second.worker is None and store.get_attempt(run.tenant, run.id, 1, 2).worker is None
    assert store.get_step(run.tenant, run.id, 1, detail=True).prompt_layers == layers
    # And later layers replace them
    store.set_prompt_layers(ref2, [PromptLayer(name="task", chars=2, sha256="cc")])
    assert [p.name for p in store.get_step(run.tenant, run.id, 1, detail=True).prompt_layers] == ["task"]
    # And a replayed op_id writes neither
    replay = store.claim_attempt(
        run.tenant,
        run.id,
        1,
        token="other",
        started_at=utcnow(),
        op_id="op-1",
        worker=WORKERS[0],  # type: ignore[arg-type]
        layers=created,
    )
    assert replay.n == 1 and replay.worker == LAMBDA
    assert [p.name for p in store.get_step(run.tenant, run.id, 1, detail=True).prompt_layers] == ["task"]


def test_a_refused_claim_writes_neither_worker_nor_layers(store: Store) -> None:
    run = new_run(store)
    claim(store, run, 0, layers=[PromptLayer(name="persona", chars=1, sha256="aa")])
    store.update_step(run.tenant, run.id, 1, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict):  # an attempt runs
        claim(
            store, run, 0, expect_status=[StepStatus.running], worker=LAMBDA, layers=[PromptLayer(name="x", chars=1, sha256="bb")]
        )
    with pytest.raises(Conflict):  # not an expected status
        claim(store, run, 1, worker=LAMBDA, layers=[PromptLayer(name="x", chars=1, sha256="bb")])
    assert snapshot(store, run) == before


def test_end_attempt_records_its_calls_in_the_same_write_replacing_spans_by_id(store: Store) -> None:
    # Given an attempt that wrote a span as it went
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.put_call(ref, ModelCall(id="turn-1", n=1, ms=10))
    # When it ends with every span it made, the first one updated
    calls = [
        ModelCall(id="turn-2", n=2, ms=20, stop="end_turn"),
        ModelCall(id="turn-1", n=1, ms=812, tokens=Tokens(input=120, output=300), stop="tool_use"),
    ]
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="r"), calls=calls)
    # Then the step holds each span once, as last written, ordered by n
    step = store.get_step(run.tenant, run.id, 0, detail=True)
    assert step.calls == [calls[1], calls[0]]
    assert store.get_run(run.tenant, run.id).step(0).calls == [calls[1], calls[0]]
    # And a second attempt's spans join them, replacing none but their own
    _, ref2 = claim(store, run, 0, expect_status=[StepStatus.completed])
    again = ModelCall(id="turn-3", n=3, attempt=2)
    store.end_attempt(ref2, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed), calls=[again])
    assert [c.id for c in store.get_step(run.tenant, run.id, 0, detail=True).calls] == ["turn-1", "turn-2", "turn-3"]


def test_a_refused_end_writes_none_of_its_calls(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.put_call(ref, ModelCall(id="turn-1", ms=1))
    store.end_attempt(ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    _, ref2 = claim(store, run, 0, expect_status=[StepStatus.failed])
    before = snapshot(store, run)
    for stale in (ref, ref.model_copy(update={"n": 2}), ref2.model_copy(update={"token": "not-the-token"})):
        with pytest.raises(AttemptEnded):
            store.end_attempt(
                stale,
                AttemptStatus.completed,
                step=StepChanges(status=StepStatus.completed),
                calls=[ModelCall(id="turn-1", ms=999), ModelCall(id="stale", n=2)],
            )
    assert snapshot(store, run) == before


def test_many_spans_of_a_long_attempt_are_all_kept(store: Store) -> None:
    # More spans than a step record keeps in itself, some written as the attempt went, all
    # written again with its end, one of them too large to keep inline
    run = new_run(store)
    _, ref = claim(store, run, 0)
    calls = [ModelCall(id=f"turn-{i:02d}", n=i, ms=i) for i in range(1, 31)]
    for call in calls[:12]:
        store.put_call(ref, call)
    calls[3] = calls[3].model_copy(update={"stop": "x" * 5000})
    calls[20] = calls[20].model_copy(update={"ms": 2020})
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed), calls=calls)
    assert store.get_step(run.tenant, run.id, 0, detail=True).calls == calls
    # And a smaller version of the large one replaces it
    _, ref2 = claim(store, run, 0, expect_status=[StepStatus.completed])
    calls[3] = calls[3].model_copy(update={"stop": "end_turn"})
    store.put_call(ref2, calls[3])
    store.end_attempt(ref2, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed), calls=[calls[3]])
    assert store.get_run(run.tenant, run.id).step(0).calls == calls


def test_heartbeat_records_when_the_worker_was_last_alive_and_is_fenced(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.heartbeat(ref, "2026-08-08T00:00:00.000Z")
    store.heartbeat(ref, "2026-08-08T00:01:00.000Z")
    assert store.get_attempt(run.tenant, run.id, 0, 1).heartbeat_at == "2026-08-08T00:01:00.000Z"

    before = snapshot(store, run)
    with pytest.raises(AttemptEnded):
        store.heartbeat(ref.model_copy(update={"token": "not-the-token"}), "2026-08-08T00:02:00.000Z")
    assert snapshot(store, run) == before

    store.end_attempt(ref, AttemptStatus.interrupted, reason="worker went away", step=StepChanges(status=StepStatus.pending))
    before = snapshot(store, run)
    with pytest.raises(AttemptEnded):
        store.heartbeat(ref, "2026-08-08T00:03:00.000Z")
    assert snapshot(store, run) == before
