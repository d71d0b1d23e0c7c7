"""Steps: read, added (rescue records) and changed outside an attempt."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from contract.store.backends import claim, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.errors import Conflict, NotFound, RunNotFound
from laneflow.domain.records import AttemptStatus, Event, ModelCall, PromptLayer, Run, Step, StepChanges, StepStatus


def test_get_steps_are_ordered_by_index_without_trace_and_filtered_by_group(store: Store) -> None:
    run = new_run(store, steps=5)
    store.add_event(run.tenant, run.id, 0, Event(text="x"))
    steps = store.get_steps(run.tenant, run.id)
    assert [s.index for s in steps] == [0, 1, 2, 3, 4]
    assert steps[0].events == []
    assert [s.index for s in store.get_steps(run.tenant, run.id, group=1)] == [2, 3]


def test_get_steps_without_messages_leaves_out_only_each_step_s_message(store: Store) -> None:
    run = new_run(store, steps=5)
    handoff = (
        "Do it.\n\n## Handoff from the previous group\n\n" + "a result of an earlier step\n" * 20_000
    )  # large: kept in S3 on DynamoDB
    claim(store, run, 2, message=handoff)
    claim(store, run, 3, message="short")
    whole = store.get_steps(run.tenant, run.id, group=1)
    light = store.get_steps(run.tenant, run.id, group=1, messages=False)
    assert [s.message for s in whole] == [handoff, "short"]
    assert [s.message for s in light] == [None, None]
    assert [s.model_dump(exclude={"message"}) for s in light] == [s.model_dump(exclude={"message"}) for s in whole]
    assert [s.index for s in store.get_steps(run.tenant, run.id, messages=False)] == [0, 1, 2, 3, 4]


def test_get_steps_for_a_settlement_reads_its_rescues_and_the_flow_steps_that_did_not_complete(store: Store) -> None:
    """A large group that went well is settled on none of its steps: `settling` admits every
    rescue, whatever its status, and each flow step neither completed nor skipped."""
    from laneflow.domain.outline import StepFilter

    run = Run(
        id=f"run-{uuid.uuid4().hex[:10]}",
        tenant="acme",
        workspace="newsroom",
        flow="brief",
        steps=[Step(index=i, group=0, agent="scout", item=f"item-{i}") for i in range(6)],
    )
    store.create_run(run)
    t, r = run.tenant, run.id
    for index, status in ((0, StepStatus.completed), (1, StepStatus.skipped), (2, StepStatus.failed), (4, StepStatus.completed)):
        store.update_step(t, r, index, StepChanges(status=status))
    store.update_step(t, r, 5, StepChanges(status=StepStatus.awaiting_approval))
    store.add_steps(t, r, [Step(index=6, group=0, agent="fixer", rescue_of=2, instruction="rescue")])
    store.update_step(t, r, 6, StepChanges(status=StepStatus.completed))

    def read(**where: Any) -> list[int]:
        return [s.index for s in store.get_steps(t, r, group=0, messages=False, where=StepFilter(**where))]

    assert read(settling=True) == [2, 3, 5, 6]
    assert read(settling=True, high=4) == [2, 3]
    assert read(settling=True, flow=True) == [2, 3, 5]


def test_get_steps_where_reads_only_what_the_filter_admits_in_index_order(store: Store) -> None:
    """A window's decision reads its window, not the whole group: statuses, flow steps only,
    an index range, each lane's first few and a limit, alone and together, on any backend."""
    from laneflow.domain.outline import StepFilter, statuses

    run = Run(
        id=f"run-{uuid.uuid4().hex[:10]}",
        tenant="acme",
        workspace="newsroom",
        flow="brief",
        steps=[
            Step(
                index=i,
                group=0 if i < 8 else 1,
                agent="scout" if i % 3 else "editor",
                model="stub" if i < 6 else "claude-x",
                item=f"item-{i}",
            )
            for i in range(10)
        ],
    )
    store.create_run(run)
    t, r = run.tenant, run.id
    store.update_step(t, r, 1, StepChanges(status=StepStatus.completed))
    store.update_step(t, r, 2, StepChanges(status=StepStatus.failed))
    claim(store, run, 4)
    store.update_step(t, r, 5, StepChanges(status=StepStatus.awaiting_approval))
    store.add_steps(t, r, [Step(index=10, group=0, agent="fixer", rescue_of=2, instruction="rescue")])

    def read(**where: Any) -> list[int]:
        return [s.index for s in store.get_steps(t, r, group=0, messages=False, where=StepFilter(**where))]

    assert read() == [0, 1, 2, 3, 4, 5, 6, 7, 10]
    assert read(statuses=statuses(StepStatus.pending, StepStatus.awaiting_approval)) == [0, 3, 5, 6, 7, 10]
    assert read(statuses=statuses(StepStatus.pending), flow=True) == [0, 3, 6, 7]
    assert read(low=3, high=6) == [3, 4, 5, 6]
    assert read(statuses=statuses(StepStatus.pending, StepStatus.running), high=4) == [0, 3, 4]
    assert read(flow=True, per_lane=2) == [
        0,
        1,
        2,
        3,
        6,
        7,
    ]  # editor@stub 0, 3; scout@stub 1, 2; scout@claude-x 7; editor@claude-x 6
    assert read(flow=True, per_lane=1) == [0, 1, 6, 7]
    assert read(statuses=statuses(StepStatus.pending), flow=True, limit=3) == [0, 3, 6]
    assert read(low=5, limit=2) == [5, 6]
    assert read(statuses=statuses(StepStatus.skipped)) == []
    assert read(agent="editor") == [0, 3, 6] and read(agent="fixer") == [10] and read(agent="nobody") == []
    store.update_step(t, r, 3, StepChanges(started_at="2026-12-01T10:00:00.000Z"))
    store.update_step(t, r, 6, StepChanges(started_at="2026-12-01T10:00:05.000Z"))
    assert read(agent="editor", started_by="2026-12-01T10:00:05.000Z") == [3, 6]  # started, at that time or before
    assert read(agent="editor", started_by="2026-12-01T10:00:04.999Z") == [3]  # never a step not started (0)
    lone = [s for s in store.get_steps(t, r, group=1, where=StepFilter(flow=True, per_lane=1))]
    assert [s.index for s in lone] == [8, 9] and lone[0] == store.get_step(t, r, 8)
    assert [s.index for s in store.get_steps(t, r, where=StepFilter(statuses=statuses(StepStatus.pending), low=7))] == [
        7,
        8,
        9,
        10,
    ]


def test_get_step_with_detail_carries_its_trace_and_a_missing_step_is_not_found(store: Store) -> None:
    run = new_run(store)
    _, ref = claim(store, run, 1)
    store.add_event(run.tenant, run.id, 1, Event(text="one"), attempt=ref)
    store.put_call(ref, ModelCall(id="c1"))
    store.set_prompt_layers(ref, [PromptLayer(name="task", chars=3, sha256="bb")])
    store.add_event(run.tenant, run.id, 2, Event(text="elsewhere"))

    plain = store.get_step(run.tenant, run.id, 1)
    detailed = store.get_step(run.tenant, run.id, 1, detail=True)

    assert plain.status == StepStatus.running and plain.events == [] and plain.calls == []
    assert [e.text for e in detailed.events] == ["one"]
    assert [c.id for c in detailed.calls] == ["c1"]
    assert [p.name for p in detailed.prompt_layers] == ["task"]
    with pytest.raises(NotFound):
        store.get_step(run.tenant, run.id, 99)


def test_get_step_status_is_the_status_and_attempts_get_step_gives_through_an_attempt_s_life(store: Store) -> None:
    run = new_run(store)
    t, r = run.tenant, run.id

    def both(index: int) -> tuple[object, int]:
        step = store.get_step(t, r, index)
        assert store.get_step_status(t, r, index) == (step.status, step.attempts)
        return store.get_step_status(t, r, index)

    assert both(0) == (StepStatus.pending, 0)
    _, ref = claim(store, run, 0)
    assert both(0) == (StepStatus.running, 1)
    store.end_attempt(ref, AttemptStatus.failed, reason="flaky", step=StepChanges(error="flaky"))
    _, again = claim(store, run, 0, expect_status=(StepStatus.running,))
    assert both(0)[1] == 2
    store.end_attempt(again, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="done"))
    assert both(0) == (StepStatus.completed, 2)
    store.update_step(t, r, 1, StepChanges(status=StepStatus.skipped, skip_reason="run stopped"))
    assert both(1) == (StepStatus.skipped, 0)
    status, _ = store.get_step_status(t, r, 0)
    assert isinstance(status, StepStatus)
    with pytest.raises(NotFound):
        store.get_step_status(t, r, 99)
    with pytest.raises(RunNotFound):
        store.get_step_status(t, "run-none", 0)
    with pytest.raises(RunNotFound):
        store.get_step_status("other", r, 0)


def test_add_steps_appends_records_and_a_taken_index_is_a_conflict_that_adds_none(store: Store) -> None:
    run = new_run(store, steps=2)
    store.add_steps(run.tenant, run.id, [Step(index=2, group=0, rescue_of=1, instruction="rescue")])
    assert store.get_step(run.tenant, run.id, 2).rescue_of == 1

    before = snapshot(store, run)
    with pytest.raises(Conflict):
        store.add_steps(run.tenant, run.id, [Step(index=3, group=0), Step(index=1, group=0)])
    assert snapshot(store, run) == before


def test_update_step_changes_only_the_named_fields_and_returns_the_step(store: Store) -> None:
    run = new_run(store)
    step = store.update_step(run.tenant, run.id, 1, StepChanges(instruction="planned", data={"plan": [1, 2]}))
    assert (step.instruction, step.data, step.agent, step.item) == ("planned", {"plan": [1, 2]}, "researcher", "item-1")
    assert store.get_step(run.tenant, run.id, 1) == step


def test_update_step_rejects_unknown_fields_and_changes_nothing(store: Store) -> None:
    run = new_run(store)
    before = snapshot(store, run)
    for changes in ({"agent": "other"}, {"index": 5}, {"status": "skipped", "nonsense": 1}):
        with pytest.raises(ValueError):
            store.update_step(run.tenant, run.id, 0, StepChanges.model_validate(changes))
    assert snapshot(store, run) == before


def test_update_step_refused_by_expect_status_is_a_conflict_naming_step_and_status_and_changes_nothing(store: Store) -> None:
    run = new_run(store, id="run-steps")
    store.update_step(run.tenant, run.id, 2, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"step 2 of run 'run-steps' is completed"):
        store.update_step(
            run.tenant,
            run.id,
            2,
            StepChanges(status=StepStatus.skipped, skip_reason="run stopped"),
            expect_status=[StepStatus.pending, StepStatus.awaiting_approval],
        )
    assert snapshot(store, run) == before


def test_the_group_outline_counts_each_group_as_its_steps_read_whole_say(store: Store) -> None:
    """NextGroup and SettleGroup decide on the outline instead of reading every step: it must
    say what the steps say, whatever the backend counts it with."""
    from laneflow.domain.outline import GroupOutline, StepFacts, outline_of

    run = new_run(store, steps=7)  # groups 0, 0, 1, 1, 2, 2, 3
    t, r = run.tenant, run.id
    store.update_step(t, r, 0, StepChanges(status=StepStatus.completed, cost_usd=0.25, savings_usd=0.0135))
    store.update_step(t, r, 1, StepChanges(status=StepStatus.failed, cost_usd=0.5, savings_usd=-0.00375))
    store.add_steps(
        t, r, [Step(index=7, group=0, rescue_of=1, agent="fixer", instruction="rescue", cost_usd=0.125, savings_usd=0.001)]
    )
    store.update_step(t, r, 2, StepChanges(status=StepStatus.failed, cycle=2))
    store.update_step(t, r, 4, StepChanges(status=StepStatus.awaiting_approval))
    store.update_step(t, r, 6, StepChanges(status=StepStatus.skipped, skip_reason="run stopped"))
    store.add_steps(t, r, [Step(index=8, group=3, agent="researcher", instruction="later")])
    claim(store, run, 8)  # a flow step running

    outline = store.get_group_outline(t, r)

    assert outline == [
        GroupOutline(
            group=0,
            cycle=0,
            pending=0,
            failed_required=1,
            unfinished_rescues=1,
            cost_usd=0.875,
            last_index=7,
            unfinished=0,
            waiting=1,
            savings_usd=0.01075,  # its steps' savings, the rescue's too (a write-only step's is below zero)
        ),
        GroupOutline(
            group=1,
            cycle=2,
            pending=1,
            failed_required=1,
            unfinished_rescues=0,
            cost_usd=0.0,
            last_index=3,
            unfinished=1,
            waiting=1,
        ),
        GroupOutline(
            group=2,
            cycle=0,
            pending=2,
            failed_required=0,
            unfinished_rescues=0,
            cost_usd=0.0,
            last_index=5,
            unfinished=1,
            waiting=2,
        ),  # step 4 awaits approval: waiting, not unfinished
        GroupOutline(
            group=3,
            cycle=0,
            pending=0,
            failed_required=0,
            unfinished_rescues=0,
            cost_usd=0.0,
            last_index=8,
            unfinished=1,
            waiting=0,
        ),  # step 8 runs
    ]
    facts = [
        StepFacts(
            index=s.index,
            group=s.group,
            cycle=s.cycle,
            status=s.status.value,
            rescue=s.rescue_of is not None,
            optional=s.optional,
            cost_usd=s.cost_usd,
            savings_usd=s.savings_usd,
        )
        for s in store.get_steps(t, r)
    ]
    assert outline_of(facts) == outline
    with pytest.raises(NotFound):
        store.get_group_outline(t, "run-none")


def test_a_steps_cache_break_and_prefix_are_kept_with_its_attempts_end_and_read_back_as_written(store: Store) -> None:
    from laneflow.domain.records import AttemptRef, AttemptStatus

    run = new_run(store)
    attempt, _ = claim(store, run, 1)
    assert store.get_step(run.tenant, run.id, 1).cache_break is None and store.get_step(run.tenant, run.id, 1).prefix is None
    broke = {"layer": "skills", "since": "run-earlier/3"}
    prefix = {"tokens": 4279, "tools": "3f2a9c0d1e2b"}
    store.end_attempt(
        AttemptRef.of(run.tenant, attempt),
        AttemptStatus.completed,
        step=StepChanges(status=StepStatus.completed, cache_break=broke, prefix=prefix),
    )
    step = store.get_step(run.tenant, run.id, 1, detail=True)
    assert (step.cache_break, step.prefix) == (broke, prefix)
    assert store.get_run(run.tenant, run.id).step(1).cache_break == broke
    # A later change can clear it (a loop's reset, a new attempt that read its prefix).
    store.update_step(run.tenant, run.id, 1, StepChanges(cache_break=None))
    assert store.get_step(run.tenant, run.id, 1).cache_break is None and store.get_step(run.tenant, run.id, 1).prefix == prefix
