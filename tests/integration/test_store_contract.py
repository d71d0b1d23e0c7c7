"""The store contract: one suite that every `Store` implementation must pass.

Each test runs once per entry of `STORE_FACTORIES`. A factory is a context manager that
takes pytest's `tmp_path` and yields a fresh, empty store whose `url` another process can
open with `open_store`: a SQLite file, or a DynamoDB table under moto built from
template.yaml's own RunsTable (so the tests cannot drift from what is deployed).

Every refused write is checked twice: that it raises the right error, and that it changed
nothing (the whole run, its steps, events, calls, layers and attempts read back equal).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from unittest import mock

import boto3
import pytest

from laneflow_dev.moto_support import serialized_dynamodb
from moto import mock_aws
from moto.server import ThreadedMotoServer

from laneflow.domain.errors import AttemptEnded, Conflict, InvalidInput, NotFound, RunNotFound
from laneflow.domain.records import Attempt, AttemptRef, AttemptStatus, Event, JournalEntry, JournalStatus, ModelCall, PromptLayer, Run, RunChanges, RunStatus, Step, StepChanges, StepStatus, Tokens, utcnow
from laneflow.adapters.store import Store, open_store
from laneflow.adapters.store.dynamodb import DynamoStore, ItemTooLarge
from laneflow.adapters.store.provision import table_spec
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution

TENANT = "local"
TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
TABLE, BUCKET, REGION = "laneflow-runs", "laneflow-blobs", "us-east-1"
BIG = 200 * 1024  # over the DynamoDB store's 64 KB blob threshold


@contextmanager
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{tmp_path / 'laneflow.db'}")
    try:
        yield store
    finally:
        store.close()


_moto_serialized = serialized_dynamodb  # the engine's threads against moto's DynamoDB


@functools.cache
def _moto_server_url() -> str:
    """An in-process moto server sharing the mock's state, for the tests' child processes
    (a second terminal's `stop`, racing claimers): they reach it through AWS_ENDPOINT_URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}"


@functools.cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()  # one for the whole run: a new one parses service models again


def create_runs_table() -> None:
    """The table as template.yaml's RunsTable declares it (key schema, indexes, billing), and
    the blob bucket."""
    _session().client("dynamodb", region_name=REGION).create_table(TableName=TABLE, **table_spec(TEMPLATE))
    _session().client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)


@contextmanager
def dynamodb_store(tmp_path: Path, *, reachable_from_children: bool = True) -> Iterator[Store]:
    with mock.patch.dict(os.environ), mock_aws(), _moto_serialized():
        for k in [k for k in os.environ if k.startswith("AWS_") and k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]:
            del os.environ[k]  # no profile, region or endpoint of the person running the tests
        os.environ["AWS_DEFAULT_REGION"] = REGION
        create_runs_table()
        store = open_store(f"dynamodb://{TABLE}?bucket={BUCKET}")
        if reachable_from_children:
            # This process's clients are made: from here on the variable only reaches children.
            os.environ["AWS_ENDPOINT_URL"] = _moto_server_url()
        try:
            yield store
        finally:
            store.close()


STORE_FACTORIES: list[Callable[[Path], AbstractContextManager[Store]]] = [sqlite_store, dynamodb_store]


@pytest.fixture(params=STORE_FACTORIES, ids=lambda factory: factory.__name__.removesuffix("_store"))
def store(request: pytest.FixtureRequest, tmp_path: Path):
    with request.param(tmp_path) as s:
        yield s


@pytest.fixture
def dynamo(tmp_path: Path):
    """The DynamoDB store alone, for what only it has (S3 blobs, its indexes, capacity)."""
    with dynamodb_store(tmp_path, reachable_from_children=False) as s:
        yield s


# -- helpers ------------------------------------------------------------------------------


def new_run(store: Store, *, steps: int = 3, tenant: str = TENANT, **fields) -> Run:
    run = Run(
        id=fields.pop("id", f"run-{uuid.uuid4().hex[:10]}"),
        tenant=tenant,
        workspace="newsroom",
        flow="brief",
        steps=[Step(index=i, group=i // 2, agent="researcher", item=f"item-{i}") for i in range(steps)],
        **fields,
    )
    store.create_run(run)
    return run


def claim(store: Store, run: Run, index: int = 0, **kwargs) -> tuple[Attempt, AttemptRef]:
    attempt = store.claim_attempt(
        run.tenant, run.id, index, token=uuid.uuid4().hex, started_at=kwargs.pop("started_at", utcnow()), **kwargs
    )
    return attempt, AttemptRef.of(run.tenant, attempt)


LAMBDA = LambdaRequest(request_id="req-1", deadline=1767225600.5)

WORKERS = [
    LocalProcess(host="desk", pid=4242, started="9001"),
    LAMBDA,
    StepFunctionsExecution(execution="arn:aws:states:us-east-1:1:execution:flow:e-1"),
    FargateTask(task="arn:aws:ecs:us-east-1:1:task/c/1", cluster="c"),
]


def journal_entry(store: Store, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
    """The journal's entry of `op_id` as the store holds it, or None: a pending one as
    `journal_pending` lists it; a settled one as `journal_settle` returns it (unchanged)."""
    for entry in store.journal_pending(tenant):
        if (entry.run_id, entry.op_id) == (run_id, op_id):
            return entry
    try:
        return store.journal_settle(tenant, run_id, op_id)
    except NotFound:
        return None


def snapshot(store: Store, run: Run) -> tuple[Run, list[Attempt]]:
    """Everything the store holds about a run, to prove a refused write changed nothing."""
    return store.get_run(run.tenant, run.id), store.list_attempts(run.tenant, run.id)


# -- runs ---------------------------------------------------------------------------------


def test_a_created_run_reads_back_with_every_field_its_steps_and_their_trace(store: Store):
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
                events=[Event(text="one", t="2026-01-01T00:00:02.100Z"), Event(text="two", type="tool", data={"k": 1})],
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


def test_get_run_without_detail_has_steps_but_no_events_calls_or_layers(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.add_event(run.tenant, run.id, 0, Event(text="hello"), attempt=ref)
    store.put_call(ref, ModelCall(id="c1"))
    store.set_prompt_layers(ref, [PromptLayer(name="persona", chars=1, sha256="aa")])

    light = store.get_run(run.tenant, run.id, detail=False)

    assert [s.index for s in light.steps] == [0, 1, 2]
    assert light.steps[0].status == StepStatus.running
    assert all(not s.events and not s.calls and not s.prompt_layers for s in light.steps)


def test_get_run_with_steps_false_is_the_run_alone(store: Store):
    run = new_run(store)
    alone = store.get_run(run.tenant, run.id, steps=False)
    assert alone.steps == []
    assert alone.model_copy(update={"steps": run.steps}) == run


def test_creating_a_run_whose_id_exists_is_a_conflict_and_changes_nothing(store: Store):
    run = new_run(store, id="run-dup")
    before = snapshot(store, run)
    with pytest.raises(Conflict, match="run-dup"):
        store.create_run(run.model_copy(update={"flow": "other", "steps": [Step(index=9, group=0)]}))
    assert snapshot(store, run) == before


def test_list_runs_is_newest_first_without_steps_limited_and_filtered_by_status(store: Store):
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


def test_a_run_of_another_tenant_is_not_found_and_cannot_be_touched(store: Store):
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


def test_a_missing_run_is_run_not_found(store: Store):
    with pytest.raises(RunNotFound):
        store.get_run(TENANT, "run-nope")
    with pytest.raises(RunNotFound):
        store.update_run(TENANT, "run-nope", RunChanges())
    with pytest.raises(RunNotFound):
        store.request_stop(TENANT, "run-nope")


def test_update_run_changes_only_the_named_fields_and_returns_the_run_as_written(store: Store):
    run = new_run(store, revision="sha256:first", options={"keep": True})
    written = store.update_run(run.tenant, run.id, RunChanges(status="running", driven_at="2026-02-02T00:00:00.000Z"))

    assert written.status == RunStatus.running
    assert written.driven_at == "2026-02-02T00:00:00.000Z"
    assert written.steps == []
    expected = run.model_copy(update={"status": RunStatus.running, "driven_at": "2026-02-02T00:00:00.000Z"})
    assert store.get_run(run.tenant, run.id) == expected


def test_costs_are_stored_rounded_without_float_drift_and_drives_accumulate(store: Store):
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


def test_update_run_adds_an_amount_on_top_of_a_value_set_in_the_same_call(store: Store):
    run = new_run(store)
    written = store.update_run(run.tenant, run.id, RunChanges(cost_usd=0.1 + 0.2, drives=1), add_drives=1)
    assert (written.cost_usd, written.drives) == (0.3, 2)


def test_update_run_rejects_fields_it_may_not_change_and_changes_nothing(store: Store):
    run = new_run(store)
    before = snapshot(store, run)
    for changes in ({"stop_requested": False}, {"id": "run-x"}, {"status": "running", "colour": "red"}):
        with pytest.raises(ValueError):
            store.update_run(run.tenant, run.id, RunChanges.model_validate(changes))
    with pytest.raises(ValueError):  # a value that is not a run status
        store.update_run(run.tenant, run.id, RunChanges(status="exploded"))
    assert snapshot(store, run) == before


def test_update_run_refused_by_expect_status_is_a_conflict_naming_run_and_status_and_changes_nothing(store: Store):
    run = new_run(store, id="run-cond")
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"run-cond.*queued"):
        store.update_run(
            run.tenant, run.id, RunChanges(status=RunStatus.failed), expect_status=[RunStatus.running], add_drives=1
        )
    assert snapshot(store, run) == before
    # The same write with a condition that holds lands.
    written = store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running), expect_status=[RunStatus.queued])
    assert written.status == RunStatus.running


def test_request_stop_is_one_way_and_no_later_update_undoes_it(store: Store):
    run = new_run(store)
    assert store.request_stop(run.tenant, run.id) is True
    assert store.request_stop(run.tenant, run.id) is False
    # A later save naming other fields (a worker that read the run before the stop) keeps it.
    store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, error=None), add_drives=1)
    assert store.get_run(run.tenant, run.id).stop_requested is True


# -- steps --------------------------------------------------------------------------------


def test_get_steps_are_ordered_by_index_without_trace_and_filtered_by_group(store: Store):
    run = new_run(store, steps=5)
    store.add_event(run.tenant, run.id, 0, Event(text="x"))
    steps = store.get_steps(run.tenant, run.id)
    assert [s.index for s in steps] == [0, 1, 2, 3, 4]
    assert steps[0].events == []
    assert [s.index for s in store.get_steps(run.tenant, run.id, group=1)] == [2, 3]


def test_get_step_with_detail_carries_its_trace_and_a_missing_step_is_not_found(store: Store):
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


def test_add_steps_appends_records_and_a_taken_index_is_a_conflict_that_adds_none(store: Store):
    run = new_run(store, steps=2)
    store.add_steps(run.tenant, run.id, [Step(index=2, group=0, rescue_of=1, instruction="rescue")])
    assert store.get_step(run.tenant, run.id, 2).rescue_of == 1

    before = snapshot(store, run)
    with pytest.raises(Conflict):
        store.add_steps(run.tenant, run.id, [Step(index=3, group=0), Step(index=1, group=0)])
    assert snapshot(store, run) == before


def test_update_step_changes_only_the_named_fields_and_returns_the_step(store: Store):
    run = new_run(store)
    step = store.update_step(run.tenant, run.id, 1, StepChanges(instruction="planned", data={"plan": [1, 2]}))
    assert (step.instruction, step.data, step.agent, step.item) == ("planned", {"plan": [1, 2]}, "researcher", "item-1")
    assert store.get_step(run.tenant, run.id, 1) == step


def test_update_step_rejects_unknown_fields_and_changes_nothing(store: Store):
    run = new_run(store)
    before = snapshot(store, run)
    for changes in ({"agent": "other"}, {"index": 5}, {"status": "skipped", "nonsense": 1}):
        with pytest.raises(ValueError):
            store.update_step(run.tenant, run.id, 0, StepChanges.model_validate(changes))
    assert snapshot(store, run) == before


def test_update_step_refused_by_expect_status_is_a_conflict_naming_step_and_status_and_changes_nothing(store: Store):
    run = new_run(store, id="run-steps")
    store.update_step(run.tenant, run.id, 2, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"step 2 of run 'run-steps' is completed"):
        store.update_step(
            run.tenant, run.id, 2, StepChanges(status=StepStatus.skipped, skip_reason="run stopped"),
            expect_status=[StepStatus.pending, StepStatus.awaiting_approval],
        )
    assert snapshot(store, run) == before


# -- attempts -----------------------------------------------------------------------------


def test_claim_creates_attempt_1_running_and_sets_the_step_running(store: Store):
    run = new_run(store)
    attempt, _ = claim(store, run, 0, started_at="2026-03-03T00:00:00.000Z", op_id="exec:Map:0:0")

    assert (attempt.n, attempt.status, attempt.op_id) == (1, AttemptStatus.running, "exec:Map:0:0")
    assert store.get_attempt(run.tenant, run.id, 0, 1) == attempt
    assert store.list_attempts(run.tenant, run.id) == [attempt]
    step = store.get_step(run.tenant, run.id, 0)
    assert (step.status, step.attempts, step.started_at) == (StepStatus.running, 1, "2026-03-03T00:00:00.000Z")


def test_a_second_claim_while_an_attempt_runs_is_a_conflict_and_changes_nothing(store: Store):
    run = new_run(store)
    claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(Conflict):
        claim(store, run, 0, expect_status=[StepStatus.pending, StepStatus.running])
    assert snapshot(store, run) == before


def test_claim_is_refused_when_the_step_status_is_not_expected(store: Store):
    run = new_run(store, id="run-done")
    store.update_step(run.tenant, run.id, 0, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict, match=r"step 0 of run 'run-done' is completed"):
        claim(store, run, 0)
    assert snapshot(store, run) == before


def test_a_missing_step_or_attempt_is_not_found(store: Store):
    run = new_run(store)
    with pytest.raises(NotFound):
        claim(store, run, 42)
    with pytest.raises(NotFound):
        store.get_attempt(run.tenant, run.id, 0, 1)
    with pytest.raises(NotFound):
        store.add_event(run.tenant, run.id, 42, Event(text="x"))


def test_end_attempt_with_the_exact_ref_ends_it_and_changes_its_step_together(store: Store):
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
        StepStatus.completed, "the answer", 0.25, "2026-04-04T00:00:00.000Z"
    )
    assert after.cost_usd == 0.0  # the run's cost is what settling a group adds up


def test_ending_the_same_attempt_again_is_attempt_ended_and_changes_nothing(store: Store):
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
def test_a_ref_differing_in_any_part_of_its_identity_is_attempt_ended_and_changes_nothing(store: Store, wrong: dict):
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


def test_fenced_writes_after_the_attempt_ended_are_attempt_ended_and_not_stored(store: Store):
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


def test_a_late_write_from_attempt_1_never_lands_on_attempt_2(store: Store):
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


def test_end_attempt_rejects_unknown_step_fields_and_the_attempt_keeps_running(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(ValueError):
        store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, agent="other"))
    assert snapshot(store, run) == before
    assert store.get_attempt(run.tenant, run.id, 0, 1).status == AttemptStatus.running


def test_a_worker_of_every_kind_claimed_with_reads_back_as_it_was_written(store: Store):
    run = new_run(store, steps=len(WORKERS))
    for index, worker in enumerate(WORKERS):
        claim(store, run, index, worker=worker)
    assert [a.worker for a in store.list_attempts(run.tenant, run.id)] == WORKERS
    assert [type(store.get_attempt(run.tenant, run.id, i, 1).worker) for i in range(len(WORKERS))] == [type(w) for w in WORKERS]


def test_a_claim_writes_its_worker_and_the_steps_prompt_layers_with_it(store: Store):
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
        run.tenant, run.id, 1, token="other", started_at=utcnow(), op_id="op-1", worker=WORKERS[0], layers=created
    )
    assert replay.n == 1 and replay.worker == LAMBDA
    assert [p.name for p in store.get_step(run.tenant, run.id, 1, detail=True).prompt_layers] == ["task"]


def test_a_refused_claim_writes_neither_worker_nor_layers(store: Store):
    run = new_run(store)
    claim(store, run, 0, layers=[PromptLayer(name="persona", chars=1, sha256="aa")])
    store.update_step(run.tenant, run.id, 1, StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    with pytest.raises(Conflict):  # an attempt runs
        claim(store, run, 0, expect_status=[StepStatus.running], worker=LAMBDA, layers=[PromptLayer(name="x", chars=1, sha256="bb")])
    with pytest.raises(Conflict):  # not an expected status
        claim(store, run, 1, worker=LAMBDA, layers=[PromptLayer(name="x", chars=1, sha256="bb")])
    assert snapshot(store, run) == before


def test_end_attempt_records_its_calls_in_the_same_write_replacing_spans_by_id(store: Store):
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


def test_a_refused_end_writes_none_of_its_calls(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.put_call(ref, ModelCall(id="turn-1", ms=1))
    store.end_attempt(ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    _, ref2 = claim(store, run, 0, expect_status=[StepStatus.failed])
    before = snapshot(store, run)
    for stale in (ref, ref.model_copy(update={"n": 2}), ref2.model_copy(update={"token": "not-the-token"})):
        with pytest.raises(AttemptEnded):
            store.end_attempt(
                stale, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed),
                calls=[ModelCall(id="turn-1", ms=999), ModelCall(id="stale", n=2)],
            )
    assert snapshot(store, run) == before


def test_many_spans_of_a_long_attempt_are_all_kept(store: Store):
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


# -- trace --------------------------------------------------------------------------------


def test_events_are_kept_in_the_order_written(store: Store):
    run = new_run(store)
    texts = [f"line {i}" for i in range(12)]
    for text in texts:
        store.add_event(run.tenant, run.id, 1, Event(text=text, t="2026-01-01T00:00:00.000Z"))
    assert [e.text for e in store.get_run(run.tenant, run.id).step(1).events] == texts


def test_an_event_written_with_an_attempt_carries_its_number(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.add_event(run.tenant, run.id, 0, Event(text="tool call", type="tool", attempt=7, data={"tool": "search"}), attempt=ref)
    (event,) = store.get_step(run.tenant, run.id, 0, detail=True).events
    assert (event.attempt, event.type, event.data) == (1, "tool", {"tool": "search"})


def test_put_call_twice_with_the_same_id_keeps_one_updated_span_and_spans_are_ordered_by_n(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.put_call(ref, ModelCall(id="turn-2", n=2, ms=10))
    store.put_call(ref, ModelCall(id="turn-1", n=1, ms=100, tokens=Tokens(input=1)))
    store.put_call(ref, ModelCall(id="turn-1", n=1, ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300), stop="end_turn"))

    calls = store.get_step(run.tenant, run.id, 0, detail=True).calls
    assert [c.id for c in calls] == ["turn-1", "turn-2"]
    assert (calls[0].ms, calls[0].ttft_ms, calls[0].tokens.output, calls[0].stop) == (812, 390, 300, "end_turn")


def test_set_prompt_layers_replaces_the_layers_of_the_step(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    store.set_prompt_layers(ref, [PromptLayer(name="persona", chars=1, sha256="aa"), PromptLayer(name="task", chars=2, sha256="bb")])
    store.set_prompt_layers(ref, [PromptLayer(name="input", chars=3, sha256="cc", dynamic=True)])
    assert store.get_step(run.tenant, run.id, 0, detail=True).prompt_layers == [
        PromptLayer(name="input", chars=3, sha256="cc", dynamic=True)
    ]


def test_add_event_rejects_an_attempt_of_another_step(store: Store):
    run = new_run(store)
    _, ref = claim(store, run, 0)
    before = snapshot(store, run)
    with pytest.raises(ValueError):
        store.add_event(run.tenant, run.id, 1, Event(text="wrong step"), attempt=ref)
    assert snapshot(store, run) == before


# -- concurrency --------------------------------------------------------------------------


def run_threads(count: int, work: Callable[[int], object]) -> list[object]:
    """Run `work(i)` on `count` threads released at once; each result or raised error."""
    start = threading.Barrier(count)
    results: list[object] = [None] * count

    def target(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[i] = error

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_twenty_threads_each_claiming_and_ending_a_different_step_all_land(store: Store):
    run = new_run(store, steps=20)

    def work(i: int) -> None:
        _, ref = claim(store, run, i, worker=LocalProcess(host="thread", pid=i))
        store.add_event(run.tenant, run.id, i, Event(text=f"working {i}"), attempt=ref)
        store.put_call(ref, ModelCall(id=f"c{i}", cost_usd=0.01))
        store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, cost_usd=0.01))

    assert run_threads(20, work) == [None] * 20
    after = store.get_run(run.tenant, run.id)
    assert all(s.status == StepStatus.completed and s.attempts == 1 for s in after.steps)
    assert all([e.text for e in s.events] == [f"working {s.index}"] and len(s.calls) == 1 for s in after.steps)
    assert round(sum(s.cost_usd for s in after.steps), 6) == 0.2
    attempts = store.list_attempts(run.tenant, run.id)
    assert [(a.index, a.n, a.status, a.worker) for a in attempts] == [
        (i, 1, AttemptStatus.completed, LocalProcess(host="thread", pid=i)) for i in range(20)
    ]


def test_twenty_threads_racing_to_claim_the_same_step_yield_exactly_one_winner(store: Store):
    run = new_run(store)
    results = run_threads(20, lambda i: claim(store, run, 0)[0])

    winners = [r for r in results if isinstance(r, Attempt)]
    assert len(winners) == 1
    assert all(isinstance(r, Conflict) for r in results if r is not winners[0])
    assert store.list_attempts(run.tenant, run.id) == winners
    step = store.get_step(run.tenant, run.id, 0)
    assert (step.status, step.attempts) == (StepStatus.running, 1)


def test_a_stop_requested_from_another_process_is_seen_by_this_one(store: Store):
    # Given a run this process is working on (a thread keeps writing its trace)
    run = new_run(store)
    _, ref = claim(store, run, 0)
    writing = threading.Event()
    done = threading.Event()
    errors: list[Exception] = []

    def keep_writing() -> None:
        while not done.is_set():
            try:
                store.add_event(run.tenant, run.id, 0, Event(text="still working"), attempt=ref)
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)
                return
            writing.set()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    writing.wait(10)
    # When a second process (a person's `laneflow stop`) opens the same store and stops it
    try:
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from laneflow.adapters.store import open_store;"
                "print(open_store(sys.argv[1]).request_stop(sys.argv[2], sys.argv[3]))",
                store.url,
                run.tenant,
                run.id,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        done.set()
        writer.join()
    # Then it set the stop, this process sees it, and neither side's writes failed
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "True"
    assert store.get_run(run.tenant, run.id).stop_requested is True
    assert store.request_stop(run.tenant, run.id) is False
    assert errors == []


_CLAIM_IN_A_CHILD = """
import os, sys, time, uuid
from laneflow.domain.errors import Conflict
from laneflow.domain.records import utcnow
from laneflow.adapters.store import open_store
url, tenant, run_id, go = sys.argv[1:]
store = open_store(url)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    print("won", store.claim_attempt(tenant, run_id, 0, token=uuid.uuid4().hex, started_at=utcnow()).n)
except Conflict:
    print("conflict")
"""


def test_processes_racing_to_claim_the_same_step_yield_exactly_one_winner(store: Store, tmp_path: Path):
    # Each process has its own connection, so only the database's transactions arbitrate.
    run = new_run(store)
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIM_IN_A_CHILD, store.url, run.tenant, run.id, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        go.touch()
        outcomes = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            child.kill()
    said = sorted(out.strip() for out, _ in outcomes)
    assert said == ["conflict", "conflict", "conflict", "won 1"], [err for _, err in outcomes]
    assert [a.n for a in store.list_attempts(run.tenant, run.id)] == [1]


# -- open_store: the URL forms ------------------------------------------------------------


def test_open_store_without_a_url_uses_laneflow_db_under_the_default_dir_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store()
    try:
        assert isinstance(store, SqliteStore)
        assert (tmp_path / ".laneflow" / "laneflow.db").is_file()
        assert store.url == f"sqlite:///{tmp_path / '.laneflow' / 'laneflow.db'}"
    finally:
        store.close()


def test_open_store_takes_relative_absolute_and_memory_sqlite_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url, file in (
        ("sqlite:///data/runs.db", tmp_path / "data" / "runs.db"),
        (f"sqlite:///{tmp_path / 'abs.db'}", tmp_path / "abs.db"),
    ):
        store = open_store(url)
        new_run(store, id="run-1")
        store.close()
        assert file.is_file()
        reopened = open_store(url)
        assert reopened.get_run(TENANT, "run-1").id == "run-1"
        reopened.close()
    memory = open_store("sqlite:///:memory:")
    new_run(memory, id="run-mem")
    assert memory.get_run(TENANT, "run-mem").id == "run-mem"
    memory.close()


def test_open_store_opens_a_dynamodb_table_with_boto3s_own_configuration(dynamo: DynamoStore):
    # The region comes from the environment as boto3 reads it; the URL's region overrides it.
    plain = open_store(f"dynamodb://{TABLE}")
    assert isinstance(plain, DynamoStore)
    assert (plain.table, plain.bucket, plain.region) == (TABLE, None, REGION)
    new_run(plain, id="run-plain")
    assert dynamo.get_run(TENANT, "run-plain").id == "run-plain"
    named = open_store(f"dynamodb://{TABLE}?bucket={BUCKET}&region=eu-west-1")
    assert (named.bucket, named.region) == (BUCKET, "eu-west-1")
    assert named.url == f"dynamodb://{TABLE}?bucket={BUCKET}&region=eu-west-1"


@pytest.mark.parametrize(
    "url", ["dynamodb://", "dynamodb://t/extra", "dynamodb://t?colour=red", "dynamodb://t?bucket=b&endpoint=http://x"]
)
def test_open_store_refuses_a_malformed_dynamodb_url_naming_the_accepted_forms(url):
    with pytest.raises(InvalidInput) as refused:
        open_store(url)
    assert repr(url) in str(refused.value) and "dynamodb://TABLE?bucket=BUCKET&region=REGION" in str(refused.value)


@pytest.mark.parametrize("url", ["postgres://db/runs", "sqlite://relative.db", "sqlite:///", "runs.db", ""])
def test_open_store_refuses_other_urls_naming_the_url_and_the_accepted_forms(url):
    with pytest.raises(InvalidInput) as refused:
        open_store(url)
    assert repr(url) in str(refused.value)
    assert "sqlite:///PATH" in str(refused.value) and "dynamodb://TABLE" in str(refused.value)


# -- handoffs and the warm gate ------------------------------------------------------------


def test_a_handoff_is_kept_per_key_and_replaced_by_a_later_put(store: Store):
    run = new_run(store)
    assert store.get_handoff(TENANT, run.id, "g1c0:results") is None
    store.put_handoff(TENANT, run.id, "g1c0:results", "first")
    store.put_handoff(TENANT, run.id, "g1c0:results", "second")
    store.put_handoff(TENANT, run.id, "g1c0:data", "data")
    assert store.get_handoff(TENANT, run.id, "g1c0:results") == "second"
    assert store.get_handoff(TENANT, run.id, "g1c0:data") == "data"
    assert store.get_handoff("other-tenant", run.id, "g1c0:results") is None


def test_the_gate_rendezvous_hands_every_token_back_exactly_once_under_a_race(store: Store):
    """Siblings arrive while the lead opens: each token is either kept and handed to the
    lead, or its sibling is told the gate is open. None is lost, none is handed back twice."""
    for trial in range(5):
        run = new_run(store)
        key = f"g0c0:lane-{trial}"
        told_open: list[str] = []
        handed: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(21)

        def sibling(n: int) -> None:
            barrier.wait()
            token = f"tok-{n}"
            if store.gate_wait(TENANT, run.id, key, token):
                with lock:
                    told_open.append(token)

        def lead() -> None:
            barrier.wait()
            time.sleep(0.001 * trial)
            tokens = store.gate_open(TENANT, run.id, key)
            with lock:
                handed.extend(tokens)

        threads = [threading.Thread(target=sibling, args=(n,)) for n in range(20)] + [threading.Thread(target=lead)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(told_open + handed) == sorted(f"tok-{n}" for n in range(20))
        assert store.gate_open(TENANT, run.id, key) == []


# -- heartbeats, running attempts and active runs ------------------------------------------


def test_heartbeat_records_when_the_worker_was_last_alive_and_is_fenced(store: Store):
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


def test_running_attempts_are_the_attempts_still_running_of_one_tenant_or_all(store: Store):
    acme, globex = new_run(store, tenant="acme"), new_run(store, tenant="globex")
    a0, _ = claim(store, acme, 0)
    _, a1_ref = claim(store, acme, 1)
    b0, b0_ref = claim(store, globex, 0)
    store.end_attempt(a1_ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    store.heartbeat(b0_ref, "2026-08-08T00:00:00.000Z")

    assert store.running_attempts("acme") == [("acme", a0)]
    assert store.running_attempts("initech") == []
    everyone = store.running_attempts()
    assert sorted((t, a.run_id, a.index, a.n) for t, a in everyone) == [("acme", acme.id, 0, 1), ("globex", globex.id, 0, 1)]
    assert dict(everyone)["globex"] == b0.model_copy(update={"heartbeat_at": "2026-08-08T00:00:00.000Z"})

    store.end_attempt(b0_ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    assert store.running_attempts() == [("acme", a0)]


def test_active_runs_are_the_queued_running_and_parked_runs_and_a_run_leaves_when_it_ends(store: Store):
    queued = new_run(store, tenant="acme", created_at="2026-01-01T00:00:00.000Z")
    running = new_run(store, tenant="acme", status=RunStatus.running, created_at="2026-01-02T00:00:00.000Z")
    parked = new_run(store, tenant="globex", status=RunStatus.awaiting_approval, created_at="2026-01-03T00:00:00.000Z")
    done = new_run(store, tenant="acme", status=RunStatus.completed, created_at="2026-01-04T00:00:00.000Z")
    new_run(store, tenant="acme", status=RunStatus.failed, created_at="2026-01-05T00:00:00.000Z")

    assert [r.id for r in store.active_runs("acme")] == [queued.id, running.id]
    assert [r.id for r in store.active_runs()] == [queued.id, running.id, parked.id]
    assert store.active_runs("acme")[0] == store.get_run("acme", queued.id, steps=False)
    assert store.active_runs("initech") == []

    # When one ends and an ended one is driven again (a re-drive)
    store.update_run("acme", running.id, RunChanges(status=RunStatus.failed, finished_at=utcnow()))
    store.update_run("acme", done.id, RunChanges(status=RunStatus.running))
    # Then the active runs follow
    assert [r.id for r in store.active_runs("acme")] == [queued.id, done.id]
    # And a write that does not change the status does not change what is active
    store.update_run("acme", queued.id, RunChanges(error="slow"), add_drives=1)
    assert [r.id for r in store.active_runs("acme")] == [queued.id, done.id]


# -- the claim journal ----------------------------------------------------------------------


def test_journal_begin_records_a_pending_claim_once_and_a_replay_gets_the_same_entry(store: Store):
    run = new_run(store)
    entry = store.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0, ttl_s=3600)

    assert (entry.tenant, entry.run_id, entry.op_id, entry.index) == (TENANT, run.id, "exec-1:RunStep:0:0", 0)
    assert (entry.status, entry.attempt, entry.token) == (JournalStatus.pending, None, None)
    assert abs(entry.expires_at - (time.time() + 3600)) < 60
    assert store.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0) == entry
    assert journal_entry(store, TENANT, run.id, "exec-1:RunStep:0:0") == entry
    assert journal_entry(store, TENANT, run.id, "exec-1:RunStep:9:0") is None
    assert store.journal_pending(TENANT) == [entry]
    assert store.journal_pending() == [entry]
    assert store.journal_pending("globex") == []


def test_journal_begin_for_a_missing_run_is_run_not_found(store: Store):
    run = new_run(store, tenant="acme")
    with pytest.raises(RunNotFound):
        store.journal_begin("globex", run.id, "op-1", 0)
    assert store.journal_pending() == []


def test_a_claim_with_an_op_id_completes_its_journal_entry_in_the_same_write(store: Store):
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-0", 0)
    attempt, _ = claim(store, run, 0, op_id="op-0")

    entry = journal_entry(store, TENANT, run.id, "op-0")
    assert entry is not None
    assert (entry.status, entry.index, entry.attempt, entry.token, entry.started_at, entry.resumed_at) == (
        JournalStatus.completed, 0, 1, attempt.token, attempt.started_at, None
    )
    assert store.journal_pending() == []

    # Without journal_begin, the claim makes the entry itself.
    other, _ = claim(store, run, 1, op_id="op-1")
    entry = journal_entry(store, TENANT, run.id, "op-1")
    assert entry is not None
    assert (entry.status, entry.index, entry.attempt, entry.token) == (JournalStatus.completed, 1, 1, other.token)


def test_a_repeated_op_id_gets_what_the_first_claim_got_and_claims_nothing(store: Store):
    run = new_run(store)
    first, ref = claim(store, run, 0, op_id="op-0")
    # A re-delivered invocation, while the first still runs
    assert store.claim_attempt(TENANT, run.id, 0, token="another", started_at=utcnow(), op_id="op-0") == first
    # And after it ended and its step completed
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    replay = store.claim_attempt(TENANT, run.id, 0, token="another", started_at=utcnow(), op_id="op-0")
    assert (replay.n, replay.token, replay.status) == (1, first.token, AttemptStatus.completed)
    assert snapshot(store, run) == before


def test_settling_a_pending_entry_whose_claim_never_landed_cancels_it_and_its_claim_is_refused(store: Store):
    # Given a crash between asking for a claim and getting it
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-lost", 0)
    # When reconcile settles it
    settled = store.journal_settle(TENANT, run.id, "op-lost")
    # Then it is cancelled, no longer pending, and stays as it is
    assert (settled.status, settled.attempt, settled.token) == (JournalStatus.cancelled, None, None)
    assert store.journal_pending() == []
    assert store.journal_settle(TENANT, run.id, "op-lost") == settled
    # And the late claim of that operation is refused and changes nothing
    before = snapshot(store, run)
    with pytest.raises(Conflict, match="op-lost"):
        claim(store, run, 0, op_id="op-lost")
    assert snapshot(store, run) == before


def test_settling_an_entry_whose_claim_landed_returns_it_completed(store: Store):
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-0", 0)
    attempt, _ = claim(store, run, 0, op_id="op-0")
    settled = store.journal_settle(TENANT, run.id, "op-0")
    assert (settled.status, settled.attempt, settled.token) == (JournalStatus.completed, 1, attempt.token)
    with pytest.raises(NotFound):
        store.journal_settle(TENANT, run.id, "op-unknown")


def test_a_step_claimed_many_times_keeps_every_attempt_span_and_journal_entry(store: Store):
    # Given a step failed and claimed again more times than a record keeps in itself
    run = new_run(store)
    claimed = []
    for i in range(1, 9):
        store.journal_begin(TENANT, run.id, f"op-{i}", 0)
        attempt, ref = claim(store, run, 0, op_id=f"op-{i}", expect_status=[StepStatus.pending, StepStatus.failed], worker=LocalProcess(host="w", pid=i))
        assert attempt.n == i
        store.heartbeat(ref, f"2026-01-01T00:00:0{i}.000Z")
        store.put_call(ref, ModelCall(id=f"turn-{i}", n=i))
        store.end_attempt(
            ref, AttemptStatus.failed, reason=f"reason {i}", step=StepChanges(status=StepStatus.failed), calls=[ModelCall(id=f"turn-{i}", n=i, ms=i)]
        )
        claimed.append((attempt, ref))
    # Then every attempt reads back, as it ended
    attempts = store.list_attempts(TENANT, run.id, 0)
    assert [(a.n, a.status, a.reason, a.worker, a.op_id, a.heartbeat_at) for a in attempts] == [
        (i, AttemptStatus.failed, f"reason {i}", LocalProcess(host="w", pid=i), f"op-{i}", f"2026-01-01T00:00:0{i}.000Z")
        for i in range(1, 9)
    ]
    assert store.list_attempts(TENANT, run.id) == attempts
    assert [store.get_attempt(TENANT, run.id, 0, i) for i in range(1, 9)] == attempts
    assert [(c.id, c.ms) for c in store.get_step(TENANT, run.id, 0, detail=True).calls] == [(f"turn-{i}", i) for i in range(1, 9)]
    for i, (attempt, ref) in enumerate(claimed, 1):
        # And every journal entry, completed with its attempt
        entry = journal_entry(store, TENANT, run.id, f"op-{i}")
        assert entry is not None
        assert (entry.status, entry.index, entry.attempt, entry.token, entry.started_at) == (
            JournalStatus.completed, 0, i, attempt.token, attempt.started_at
        )
        # And a re-delivered invocation of any of them gets what it got and claims nothing
        assert store.journal_begin(TENANT, run.id, f"op-{i}", 0) == entry
        assert store.journal_settle(TENANT, run.id, f"op-{i}") == entry
        replay = store.claim_attempt(TENANT, run.id, 0, token="again", started_at=utcnow(), op_id=f"op-{i}", expect_status=[StepStatus.failed])
        assert replay == attempts[i - 1]
        # And its late writes never land
        with pytest.raises(AttemptEnded):
            store.heartbeat(ref, utcnow())
    assert store.list_attempts(TENANT, run.id, 0) == attempts
    assert store.journal_pending() == []


def test_an_entry_left_pending_while_another_claims_attempt_runs_stays_pending_after_it_ends(store: Store):
    # Given a claim whose attempt runs, and a second invocation journaled while it does (refused)
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-a", 0)
    _, ref = claim(store, run, 0, op_id="op-a")
    store.journal_begin(TENANT, run.id, "op-b", 0)
    with pytest.raises(Conflict):
        claim(store, run, 0, op_id="op-b", expect_status=[StepStatus.pending, StepStatus.running])
    assert [e.op_id for e in store.journal_pending(TENANT)] == ["op-b"]
    # When the attempt ends
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    # Then the entry is still pending, until it is settled
    assert store.running_attempts(TENANT) == []
    assert [e.op_id for e in store.journal_pending(TENANT)] == ["op-b"]
    assert store.journal_settle(TENANT, run.id, "op-b").status == JournalStatus.cancelled
    assert store.journal_pending() == []
    assert journal_entry(store, TENANT, run.id, "op-a").status == JournalStatus.completed  # type: ignore[union-attr]


# -- large values ---------------------------------------------------------------------------


def big_text(size: int = BIG, seed: str = "") -> str:
    """Text of `size` characters, not all ASCII (so bytes and characters differ)."""
    unit = f"{seed}tides é ✓ 潮汐 {uuid.uuid4().hex} "
    return (unit * (size // len(unit) + 1))[:size]


def test_large_values_round_trip_exactly(store: Store):
    # Given a run whose input, instruction, result, conclusion, data, trace, handoff and
    # attempt reason are each larger than a blob threshold
    big = {name: big_text(seed=name) for name in ("input", "event", "row", "stop", "handoff", "result", "conclusion", "reason", "instruction")}
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


def test_a_run_of_more_steps_than_one_write_holds_is_created_whole_and_its_id_still_conflicts(store: Store):
    run = new_run(store, id="run-wide", steps=150)
    assert [s.index for s in store.get_steps(TENANT, run.id)] == list(range(150))
    assert [r.id for r in store.list_runs(TENANT)] == ["run-wide"]
    with pytest.raises(Conflict, match="run-wide"):
        store.create_run(run)


# -- DynamoDB only: where values live, which index is read, what a step costs ---------------


def raw_items() -> list[dict]:
    return _session().client("dynamodb", region_name=REGION).scan(TableName=TABLE)["Items"]


def blob(pointer: str) -> str:
    bucket, _, key = pointer.removeprefix("s3://").partition("/")
    return _session().client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def test_dynamodb_values_over_the_threshold_go_to_s3_and_every_item_stays_under_400_kb(dynamo: DynamoStore):
    # Given a result over the 64 KB threshold, and a conclusion and data under it
    run = new_run(dynamo, input={"document": big_text()}, steps=2)
    _, ref = claim(dynamo, run, 0)
    result, conclusion, data = big_text(seed="result"), big_text(50_000, seed="c"), big_text(50_000, seed="d")
    dynamo.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result=result, conclusion=conclusion, data=data))

    # Then the result is a pointer to its text under the run's own prefix; the others stay
    (step,) = [i for i in raw_items() if i["sk"]["S"] == "S#00000000"]
    pointer = step["result"]["M"]["s3"]["S"]
    assert pointer.startswith(f"s3://{BUCKET}/{TENANT}/{run.id}/")
    assert blob(pointer) == result
    assert step["conclusion"]["S"] == conclusion
    assert dynamo.get_step(TENANT, run.id, 0).result == result

    # When values under the threshold would together pass ~350 KB, the largest go to S3 too
    roomy = DynamoStore(TABLE, bucket=BUCKET, region=REGION, blob_threshold=10**9)
    sizes = {"instruction": 150_000, "result": 140_000, "conclusion": 130_000}
    texts = {field: big_text(size, seed=field) for field, size in sizes.items()}
    roomy.update_step(TENANT, run.id, 1, StepChanges(**texts))
    (fresh,) = [i for i in raw_items() if i["sk"]["S"] == "S#00000001"]
    assert "M" in fresh["instruction"] and "S" in fresh["conclusion"]
    # And when what an item already holds would take it past 400 KB, the write moves its own
    # large values to S3 and lands
    roomy.update_step(TENANT, run.id, 0, StepChanges(**texts))
    assert all(len(json.dumps(item)) < 400 * 1024 for item in raw_items())
    for index in (0, 1):
        read = roomy.get_step(TENANT, run.id, index)
        assert (read.instruction, read.result, read.conclusion) == (texts["instruction"], texts["result"], texts["conclusion"])


def test_dynamodb_without_a_bucket_refuses_what_cannot_fit_an_item_and_keeps_what_can(dynamo: DynamoStore):
    plain = DynamoStore(TABLE, region=REGION)
    run = new_run(plain)
    _, ref = claim(plain, run, 0)
    before = snapshot(plain, run)
    with pytest.raises(ItemTooLarge, match=r"bucket=BUCKET.*result"):
        plain.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="x" * 500_000))
    with pytest.raises(ItemTooLarge):
        new_run(plain, input={"document": "x" * 500_000})
    assert snapshot(plain, run) == before
    assert plain.get_attempt(TENANT, run.id, 0, 1).status == AttemptStatus.running
    # Over the blob threshold but within an item: kept in the item
    plain.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="y" * 100_000))
    assert plain.get_step(TENANT, run.id, 0).result == "y" * 100_000


def test_dynamodb_live_lookups_read_the_sparse_index_never_the_table(dynamo: DynamoStore):
    session = boto3.session.Session(region_name=REGION)
    requests: list[tuple[str, str | None]] = []
    session.events.register(
        "before-parameter-build.dynamodb", lambda model, params, **_: requests.append((model.name, params.get("IndexName")))
    )
    watched = DynamoStore(TABLE, bucket=BUCKET, session=session)
    # Given live and ended runs, attempts and journal entries
    live, ended = new_run(dynamo, steps=2), new_run(dynamo, status=RunStatus.completed)
    dynamo.journal_begin(TENANT, live.id, "op-pending", 1)
    _, running = claim(dynamo, live, 0, op_id="op-0")
    _, done = claim(dynamo, ended, 0)
    dynamo.end_attempt(done, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))

    # When the live things are asked for, of one tenant and of all
    assert [r.id for r in watched.active_runs(TENANT)] == [r.id for r in watched.active_runs()] == [live.id]
    assert [a.n for _, a in watched.running_attempts(TENANT)] == [a.n for _, a in watched.running_attempts()] == [1]
    assert [e.op_id for e in watched.journal_pending(TENANT)] == [e.op_id for e in watched.journal_pending()] == ["op-pending"]

    # Then only the live index was queried or scanned (and the items it named read by key)
    assert {name for name, _ in requests} == {"Query", "Scan", "BatchGetItem"}
    assert all(index == "live" for name, index in requests if name in ("Query", "Scan"))
    # And the index holds exactly what is live: the run, the step with a running attempt, the
    # step with a pending journal entry
    def live_index() -> list[str]:
        return sorted(i["sk"]["S"] for i in _session().client("dynamodb", region_name=REGION).scan(TableName=TABLE, IndexName="live")["Items"])

    assert live_index() == ["RUN", "S#00000000", "S#00000001"]
    # And a step leaves it with the last live thing it has
    dynamo.end_attempt(running, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert live_index() == ["RUN", "S#00000001"]
    dynamo.journal_settle(TENANT, live.id, "op-pending")
    assert live_index() == ["RUN"]


def test_dynamodb_a_step_item_keeps_a_bounded_part_of_its_history(dynamo: DynamoStore):
    from laneflow.adapters.store.dynamodb import ATTEMPTS_ON_STEP, CALLS_ON_STEP, JOURNAL_ON_STEP

    # Given a step claimed many times, each attempt with spans, one journal entry expiring at once
    run = new_run(dynamo)
    for i in range(1, 11):
        dynamo.journal_begin(TENANT, run.id, f"op-{i}", 0, ttl_s=-1 if i == 1 else 3600)
        _, ref = claim(dynamo, run, 0, op_id=f"op-{i}", expect_status=[StepStatus.pending, StepStatus.failed])
        calls = [ModelCall(id=f"turn-{i}-{k}", n=3 * i + k) for k in range(3)]
        dynamo.end_attempt(ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed), calls=calls)
    # Then the step item keeps only its latest attempts, settled entries and a few spans
    (step,) = [i for i in raw_items() if i["pk"]["S"].endswith(run.id) and i["sk"]["S"] == "S#00000000"]
    assert {k for k in step if re.fullmatch(r"A\d+", k)} == {f"A{n}" for n in range(11 - ATTEMPTS_ON_STEP, 11)}
    assert len([k for k in step if re.fullmatch(r"J[0-9a-f]{16}", k)]) == JOURNAL_ON_STEP
    assert len(step["calls"]["M"]) == CALLS_ON_STEP
    assert len(json.dumps(step)) < 3000
    # And the rest are items of their own, read back whole
    assert [a.n for a in dynamo.list_attempts(TENANT, run.id)] == list(range(1, 11))
    assert len(dynamo.get_step(TENANT, run.id, 0, detail=True).calls) == 30
    # And a settled entry past its expiry is gone, as DynamoDB's TTL would make it
    assert journal_entry(dynamo, TENANT, run.id, "op-1") is None
    assert journal_entry(dynamo, TENANT, run.id, "op-2").attempt == 2  # type: ignore[union-attr]


def test_dynamodb_a_step_stays_in_the_live_index_while_it_has_a_pending_entry(dynamo: DynamoStore):
    def live_index() -> list[str]:
        return sorted(i["sk"]["S"] for i in _session().client("dynamodb", region_name=REGION).scan(TableName=TABLE, IndexName="live")["Items"])

    run = new_run(dynamo, status=RunStatus.completed)
    dynamo.journal_begin(TENANT, run.id, "op-a", 0)
    _, ref = claim(dynamo, run, 0, op_id="op-a")
    dynamo.journal_begin(TENANT, run.id, "op-b", 0)
    assert live_index() == ["S#00000000"]
    dynamo.consumed(reset=True)
    dynamo.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert live_index() == ["S#00000000"]  # op-b is still pending
    # (its cheap form, leaving the index, was refused; the form that stays wrote no index entry)
    assert dynamo.consumed()["write"]["end_attempt"] == 1
    dynamo.journal_settle(TENANT, run.id, "op-b")
    assert live_index() == []


def test_dynamodb_counts_the_write_units_each_step_operation_consumes(dynamo: DynamoStore):
    # Given a step run with every attempt-scoped write (small items, as the stub model makes them)
    run = new_run(dynamo, steps=1)
    dynamo.consumed(reset=True)
    dynamo.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0)
    _, ref = claim(dynamo, run, 0, op_id="exec-1:RunStep:0:0", worker=LambdaRequest(request_id=uuid.uuid4().hex, deadline=time.time()))
    dynamo.set_prompt_layers(ref, [PromptLayer(name=n, chars=812, sha256="3f2a9c1d0b7e", dynamic=n == "input") for n in ("persona", "shared", "task", "input")])
    dynamo.add_event(TENANT, run.id, 0, Event(type="tool", text="search tides of the north sea", data={"tool": "search"}), attempt=ref)
    dynamo.put_call(ref, ModelCall(id="turn-1", ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300, cache_read=4100), stop="end_turn"))
    dynamo.heartbeat(ref, utcnow())
    dynamo.end_attempt(
        ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="the answer", cost_usd=0.01, finished_at=utcnow())
    )
    # Then each costs what the item layout promises: one conditional write of the step item
    # (billed on the whole item: past 1 KB once it holds layers, worker and a span), a
    # transaction (2x per item) where one item cannot carry it (an event), plus index entries
    assert dynamo.consumed()["write"] == {
        "journal_begin": 2,  # the entry on the step item + the step's live-index entry
        "claim_attempt": 1,  # the step item alone (with its worker); its live-index entry stays as it is
        "set_prompt_layers": 1,
        "add_event": 4,  # transaction: the step's ConditionCheck + the event
        "put_call": 2,  # into the step item (now over 1 KB)
        "heartbeat": 2,
        "end_attempt": 3,  # the step item (over 1 KB: 2); the step leaves the index (the run's cost is settled per group)
    }


STEP_OP = "exec-1:RunStep:0:0"


def drive_a_small_step(dynamo: DynamoStore, *, retry: bool) -> list[tuple[str, dict[str, float]]]:
    """The store calls the domain makes for one single-turn step (step.py): journal_begin,
    the claim with its worker and layers, the end with its span (and, with `retry`, an
    attempt that failed first and a second claim). Each call's write units, by operation."""
    run = new_run(dynamo, steps=1)
    worker = LambdaRequest(request_id=str(uuid.uuid4()), deadline=time.time() + 900)
    layers = [PromptLayer(name=n, chars=812, sha256="3f2a9c1d0b7e", dynamic=n == "input") for n in ("persona", "shared", "task", "input")]
    span = ModelCall(id="turn-1", ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300, cache_read=4100), stop="end_turn", cost_usd=0.01)
    done = {"status": StepStatus.completed, "result": "the answer", "conclusion": "done", "data": None, "error": None}
    costs: list[tuple[str, dict[str, float]]] = []

    def measured(label: str, call: Callable[[], object]) -> object:
        dynamo.consumed(reset=True)
        out = call()
        costs.append((label, dynamo.consumed()["write"]))
        return out

    measured("journal_begin", lambda: dynamo.journal_begin(TENANT, run.id, STEP_OP, 0))
    _, ref = measured("claim", lambda: claim(dynamo, run, 0, op_id=STEP_OP, worker=worker, layers=layers))  # type: ignore[misc]
    if retry:
        error = "model error: overloaded"
        measured("end failed", lambda: dynamo.end_attempt(ref, AttemptStatus.failed, reason=error, step=StepChanges(error=error, cost_usd=0.01), calls=[span]))
        _, ref = measured("claim again", lambda: claim(dynamo, run, 0, expect_status=[StepStatus.running], worker=worker))  # type: ignore[misc]
        span = span.model_copy(update={"id": "turn-2", "n": 2, "attempt": 2})
    step = StepChanges(**done, cost_usd=0.02 if retry else 0.01, finished_at=utcnow())
    measured("end", lambda: dynamo.end_attempt(ref, AttemptStatus.completed, step=step, calls=[span]))
    # What was written is what the step reads back as
    read = dynamo.get_step(TENANT, run.id, 0, detail=True)
    assert (read.status, read.result, read.prompt_layers, read.calls[-1]) == (StepStatus.completed, "the answer", layers, span)
    assert journal_entry(dynamo, TENANT, run.id, STEP_OP).status == JournalStatus.completed  # type: ignore[union-attr]
    assert dynamo.running_attempts(TENANT) == [] and dynamo.journal_pending(TENANT) == []
    for label, units in costs:
        print(f"{label:>14}: {sum(units.values()):g} WCU {units}")
    print(f"{'step':>14}: {sum(sum(u.values()) for _, u in costs):g} WCU")
    return costs


def test_dynamodb_a_small_steps_happy_path_writes_six_units_in_three_single_item_writes(dynamo: DynamoStore):
    # (Before the step item carried its attempt, journal entry, layers and spans: 2 + 8 + 7 =
    # 17, the claim and the end each a transaction over the step, attempt, journal or span items.)
    requests: list[str] = []
    dynamo._db.meta.events.register("before-parameter-build.dynamodb", lambda model, **_: requests.append(model.name))
    costs = drive_a_small_step(dynamo, retry=False)
    assert [(label, sum(units.values())) for label, units in costs] == [
        ("journal_begin", 2),  # the entry + the step's live-index entry
        ("claim", 1),  # the step item (< 1 KB with worker and layers); the index entry stays
        ("end", 3),  # the step item (now 1.1 KB: 2) + the step leaves the live index
    ]
    assert sum(sum(units.values()) for _, units in costs) <= 6
    writes = [name for name in requests if name in ("PutItem", "UpdateItem", "TransactWriteItems", "BatchWriteItem", "DeleteItem")]
    assert writes[-3:] == ["UpdateItem"] * 3  # (the first are the run's creation)


def test_dynamodb_a_small_step_with_one_retry_writes_twelve_units(dynamo: DynamoStore):
    # (Before: 2 + 8 + 7 + 5 + 7 = 29.)
    costs = drive_a_small_step(dynamo, retry=True)
    assert [(label, sum(units.values())) for label, units in costs] == [
        ("journal_begin", 2),
        ("claim", 1),
        ("end failed", 3),  # the step item (1.1 KB) + it leaves the live index: nothing of it is live
        ("claim again", 3),  # the step item (1.4 KB) + it enters the index again
        ("end", 3),
    ]
