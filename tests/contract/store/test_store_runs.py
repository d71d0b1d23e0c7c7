"""Runs: created, read, listed, changed, stopped."""

from __future__ import annotations

import pytest

from contract.store.backends import BIG, TENANT, claim, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.errors import Conflict, RunNotFound
from laneflow.domain.records import (
    AttemptStatus,
    Event,
    ModelCall,
    PromptLayer,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
    Tokens,
    utcnow,
)


def test_a_created_run_reads_back_with_every_field_its_steps_and_their_trace(store: Store) -> None:
    # Given a run with a non-default value in every field, and steps carrying a trace
    run = Run(
        id="run-full",
        tenant="acme",
        workspace="newsroom",
        flow="brief",
        status=RunStatus.running,
        input={"topic": "tides", "n": 3, "nested": {"a": [1, 2.5, None, "é"]}},
        stop_requested=True,
        created_at="2026-01-01T00:00:00.000Z",
        driven_at="2026-01-01T00:00:01.000Z",
        finished_at="2026-01-01T00:00:09.000Z",
        parked_at="2026-01-01T00:00:05.000Z",
        revision="sha256:abc",
        cost_usd=0.123456,
        drives=2,
        error="boom",
        model="claude-x",
        options={"pool": 4},
        execution="exec-1",
        workspace_uri="file:///srv/newsroom",
        flow_spec={"steps": [{"agent": "researcher"}]},
        steps=[
            Step(
                index=0,
                group=0,
                entry=1,
                slot=2,
                agent="researcher",
                item={"name": "tides"},
                model="claude-x",
                status=StepStatus.completed,
                attempts=2,
                cycle=1,
                instruction="look",
                result="found",
                conclusion="done",
                data={"score": 0.5},
                skip_reason=None,
                error=None,
                optional=True,
                cost_usd=0.01,
                started_at="2026-01-01T00:00:02.000Z",
                finished_at="2026-01-01T00:00:03.000Z",
                events=[Event(text="one", t="2026-01-01T00:00:02.100Z"), Event(text="two", type="tool", data={"k": 1})],  # type: ignore[arg-type]
                calls=[ModelCall(id="c1", n=1, tokens=Tokens(input=5, output=7), tools=1, stop="end_turn", cost_usd=0.01)],
                prompt_layers=[PromptLayer(name="persona", chars=10, sha256="3f2a", dynamic=False)],
            ),
            Step(index=1, group=1, rescue_of=0, status=StepStatus.skipped, skip_reason="run stopped"),
        ],
    )
    # When it is created and read back
    store.create_run(run)
    # Then every field survives, internal ones included
    assert store.get_run("acme", "run-full") == run


def test_get_run_without_detail_has_steps_but_no_events_calls_or_layers(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.add_event(run.tenant, run.id, 0, Event(text="hello"), attempt=ref)
    store.put_call(ref, ModelCall(id="c1"))
    store.set_prompt_layers(ref, [PromptLayer(name="persona", chars=1, sha256="aa")])

    light = store.get_run(run.tenant, run.id, detail=False)

    assert [s.index for s in light.steps] == [0, 1, 2]
    assert light.steps[0].status == StepStatus.running
    assert all(not s.events and not s.calls and not s.prompt_layers for s in light.steps)


def test_get_run_with_steps_false_is_the_run_alone(store: Store) -> None:
    run = new_run(store)
    alone = store.get_run(run.tenant, run.id, steps=False)
    assert alone.steps == []
    assert alone.model_copy(update={"steps": run.steps}) == run


def test_get_run_without_its_input_is_the_run_with_input_none_and_get_run_input_gives_the_input(store: Store) -> None:
    # Given a run whose input is large (the DynamoDB store keeps it in S3) and its flow
    items = [f"item-{i:06d}" for i in range(BIG // 10)]
    run = new_run(
        store,
        input={"items": items, "nested": {"a": [1, 2.5, None, "é"]}},
        flow_spec={"steps": [{"agent": "a"}]},
        workspace_uri="/srv/ws",
        options={"gate": True},
    )
    # When it is read without its input, everything else reads as it is stored
    head = store.get_run(run.tenant, run.id, steps=False, input=False)
    assert head.input is None and head.steps == []
    assert head.model_copy(update={"input": run.input, "steps": run.steps}) == run
    assert head.flow_spec == run.flow_spec and head.workspace_uri == "/srv/ws"
    # And its input is read by itself, again the same on a later read
    assert store.get_run_input(run.tenant, run.id) == run.input
    assert store.get_run_input(run.tenant, run.id) == run.input
    # And with its steps, without the input
    with_steps = store.get_run(run.tenant, run.id, input=False)
    assert with_steps.input is None and [s.index for s in with_steps.steps] == [0, 1, 2]


def test_a_run_s_input_stays_what_it_was_created_with_whatever_the_run_goes_through(store: Store) -> None:
    run = new_run(store, input={"topic": "tides"})
    assert store.get_run_input(run.tenant, run.id) == {"topic": "tides"}
    store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, options={"x": 1}, cost_usd=1.5, drives=2))
    store.request_stop(run.tenant, run.id)
    assert store.get_run_input(run.tenant, run.id) == {"topic": "tides"}
    assert store.get_run(run.tenant, run.id, steps=False).input == {"topic": "tides"}
    plain = new_run(store)  # created without one: the default, as get_run gives it
    assert store.get_run_input(plain.tenant, plain.id) == {} == store.get_run(plain.tenant, plain.id).input


def test_get_run_input_of_a_missing_run_or_another_tenant_s_is_run_not_found(store: Store) -> None:
    run = new_run(store, tenant="acme", input={"secret": "plans"})
    with pytest.raises(RunNotFound):
        store.get_run_input("globex", run.id)
    with pytest.raises(RunNotFound):
        store.get_run_input(TENANT, "run-nope")
    with pytest.raises(RunNotFound):
        store.get_run(TENANT, "run-nope", steps=False, input=False)
    assert store.get_run_input("acme", run.id) == {"secret": "plans"}


def test_creating_a_run_whose_id_exists_is_a_conflict_and_changes_nothing(store: Store) -> None:
    run = new_run(store, id="run-dup")
    before = snapshot(store, run)
    with pytest.raises(Conflict, match="run-dup"):
        store.create_run(run.model_copy(update={"flow": "other", "steps": [Step(index=9, group=0)]}))
    assert snapshot(store, run) == before


def test_list_runs_is_newest_first_without_steps_limited_and_filtered_by_status(store: Store) -> None:
    old = new_run(store, created_at="2026-01-01T00:00:00.000Z")
    mid = new_run(store, created_at="2026-01-02T00:00:00.000Z", status=RunStatus.completed)
    new = new_run(store, created_at="2026-01-03T00:00:00.000Z")
    new_run(store, tenant="other", created_at="2026-01-04T00:00:00.000Z")

    listed = store.list_runs(TENANT)
    assert [r.id for r in listed] == [new.id, mid.id, old.id]
    assert all(r.steps == [] for r in listed)
    assert [r.id for r in store.list_runs(TENANT, limit=2)] == [new.id, mid.id]
    assert [r.id for r in store.list_runs(TENANT, status=[RunStatus.queued])] == [new.id, old.id]
    assert [r.id for r in store.list_runs(TENANT, status=[RunStatus.completed, RunStatus.failed])] == [mid.id]


def test_a_run_of_another_tenant_is_not_found_and_cannot_be_touched(store: Store) -> None:
    run = new_run(store, tenant="acme")
    before = snapshot(store, run)
    other = "globex"
    for call in (
        lambda: store.get_run(other, run.id),
        lambda: store.update_run(other, run.id, RunChanges(status=RunStatus.failed)),
        lambda: store.request_stop(other, run.id),
        lambda: store.get_steps(other, run.id),
        lambda: store.get_step(other, run.id, 0),
        lambda: store.add_steps(other, run.id, [Step(index=7, group=0)]),
        lambda: store.update_step(other, run.id, 0, StepChanges(status=StepStatus.skipped)),
        lambda: store.claim_attempt(other, run.id, 0, token="t", started_at=utcnow()),
        lambda: store.list_attempts(other, run.id),
        lambda: store.add_event(other, run.id, 0, Event(text="x")),
    ):
        with pytest.raises(RunNotFound):
            call()
    assert store.list_runs(other) == []
    assert snapshot(store, run) == before


def test_a_missing_run_is_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFound):
        store.get_run(TENANT, "run-nope")
    with pytest.raises(RunNotFound):
        store.update_run(TENANT, "run-nope", RunChanges())
    with pytest.raises(RunNotFound):
        store.request_stop(TENANT, "run-nope")


def test_update_run_changes_only_the_named_fields_and_returns_the_run_as_written(store: Store) -> None:
    run = new_run(store, revision="sha256:first", options={"keep": True})
    written = store.update_run(run.tenant, run.id, RunChanges(status="running", driven_at="2026-02-02T00:00:00.000Z"))  # type: ignore[arg-type]

    assert written.status == RunStatus.running
    assert written.driven_at == "2026-02-02T00:00:00.000Z"
    assert written.steps == []
    expected = run.model_copy(update={"status": RunStatus.running, "driven_at": "2026-02-02T00:00:00.000Z"})
    assert store.get_run(run.tenant, run.id) == expected


def test_costs_are_stored_rounded_without_float_drift_and_drives_accumulate(store: Store) -> None:
    # (Summed as plain floats, 100 x 0.1 is 9.99999999999998 and 100 x 0.07 is 7.000000000000009.)
    run = new_run(store)
    drift = sum([0.1] * 100)
    for _ in range(100):
        written = store.update_run(run.tenant, run.id, RunChanges(), add_drives=1)
    written = store.update_run(run.tenant, run.id, RunChanges(cost_usd=drift))
    assert (written.cost_usd, written.drives) == (10.0, 100)

    other = new_run(store, steps=1)
    _, ref = claim(store, other, 0)
    store.end_attempt(ref, AttemptStatus.failed, step=StepChanges(status=StepStatus.failed, cost_usd=sum([0.07] * 100)))
    assert store.get_step(other.tenant, other.id, 0).cost_usd == 7.0


def test_update_run_adds_an_amount_on_top_of_a_value_set_in_the_same_call(store: Store) -> None:
    run = new_run(store)
    written = store.update_run(run.tenant, run.id, RunChanges(cost_usd=0.1 + 0.2, drives=1), add_drives=1)
    assert (written.cost_usd, written.drives) == (0.3, 2)


def test_update_run_rejects_fields_it_may_not_change_and_changes_nothing(store: Store) -> None:
    run = new_run(store)
    before = snapshot(store, run)
    for changes in ({"stop_requested": False}, {"id": "run-x"}, {"status": "running", "colour": "red"}):
        with pytest.raises(ValueError):
            store.update_run(run.tenant, run.id, RunChanges.model_validate(changes))
    with pytest.raises(ValueError):  # a value that is not a run status
        store.update_run(run.tenant, run.id, RunChanges(status="exploded"))  # type: ignore[arg-type]
    assert snapshot(store, run) == before


def test_update_run_refused_by_expect_status_is_a_conflict_naming_run_and_status_and_changes_nothing(store: Store) -> None:
    run = new_run(store, id="run-cond")
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"run-cond.*queued"):
        store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.failed), expect_status=[RunStatus.running], add_drives=1)
    assert snapshot(store, run) == before
    # The same write with a condition that holds lands.
    written = store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running), expect_status=[RunStatus.queued])
    assert written.status == RunStatus.running


def test_request_stop_is_one_way_and_no_later_update_undoes_it(store: Store) -> None:
    run = new_run(store)
    assert store.request_stop(run.tenant, run.id) is True
    assert store.request_stop(run.tenant, run.id) is False
    # A later save naming other fields (a worker that read the run before the stop) keeps it.
    store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, error=None), add_drives=1)
    assert store.get_run(run.tenant, run.id).stop_requested is True


def test_a_run_of_more_steps_than_one_write_holds_is_created_whole_and_its_id_still_conflicts(store: Store) -> None:
    run = new_run(store, id="run-wide", steps=150)
    assert [s.index for s in store.get_steps(TENANT, run.id)] == list(range(150))
    assert [r.id for r in store.list_runs(TENANT)] == ["run-wide"]
    with pytest.raises(Conflict, match="run-wide"):
        store.create_run(run)


def test_a_running_run_lists_with_what_its_steps_have_spent_before_any_group_settles(store: Store) -> None:
    """A run's stored cost is settled at a group's end; listed (`laneflow runs`, GET /runs, the
    viewer's list) a running run shows what its steps have spent so far, an ended one its
    settled cost."""
    from laneflow.domain.records import RunChanges, RunStatus
    from laneflow.usecases.list_runs import runs_with_live_cost
    from laneflow.wiring import for_store

    running = new_run(store, steps=3)
    store.update_run(running.tenant, running.id, RunChanges(status=RunStatus.running))
    store.update_step(running.tenant, running.id, 0, StepChanges(status=StepStatus.completed, cost_usd=0.25))
    store.update_step(running.tenant, running.id, 1, StepChanges(status=StepStatus.running, cost_usd=0.125))
    ended = new_run(store, steps=1)
    store.update_run(ended.tenant, ended.id, RunChanges(status=RunStatus.completed, cost_usd=0.5))

    listed = {r.id: r for r in runs_with_live_cost(for_store(store), running.tenant)}
    assert store.get_run(running.tenant, running.id, steps=False).cost_usd == 0.0
    assert listed[running.id].cost_usd == 0.375
    assert listed[ended.id].cost_usd == 0.5


def test_add_run_cost_adds_to_an_active_runs_cost_exactly_and_returns_it_as_written(store: Store) -> None:
    run = new_run(store, status=RunStatus.running)
    written = [store.add_run_cost(run.tenant, run.id, 0.1) for _ in range(3)]
    assert written == [0.1, 0.2, 0.3]  # no binary drift (summed as floats, the third is 0.30000000000000004)
    assert store.add_run_cost(run.tenant, run.id, 0) == 0.3
    assert store.get_run(run.tenant, run.id, steps=False).cost_usd == 0.3
    store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.awaiting_approval))
    assert store.add_run_cost(run.tenant, run.id, 0.05) == 0.35


def test_add_run_cost_on_an_ended_run_adds_nothing_and_says_so(store: Store) -> None:
    run = new_run(store, status=RunStatus.running)
    store.add_run_cost(run.tenant, run.id, 0.25)
    store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.completed, cost_usd=0.5))
    assert store.add_run_cost(run.tenant, run.id, 0.25) is None
    assert store.get_run(run.tenant, run.id, steps=False).cost_usd == 0.5


def test_add_run_cost_refuses_an_unknown_run_and_an_amount_that_is_not_a_cost(store: Store) -> None:
    run = new_run(store, status=RunStatus.running)
    with pytest.raises(RunNotFound):
        store.add_run_cost(run.tenant, "run-nowhere", 0.1)
    with pytest.raises(RunNotFound):  # another tenant's run is not there for this one
        store.add_run_cost("other", run.id, 0.1)
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            store.add_run_cost(run.tenant, run.id, bad)
    assert store.get_run(run.tenant, run.id, steps=False).cost_usd == 0.0
