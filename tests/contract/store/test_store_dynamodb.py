"""DynamoDB only: where values live, which index is read, what a step costs."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable

import boto3
import pytest

from contract.store.backends import (
    BUCKET,
    REGION,
    TABLE,
    TENANT,
    aws_session,
    big_text,
    blob,
    claim,
    journal_entry,
    new_run,
    raw_items,
    snapshot,
)
from laneflow.adapters.store.dynamodb import DynamoStore, ItemTooLarge
from laneflow.domain.records import (
    AttemptStatus,
    Event,
    JournalStatus,
    ModelCall,
    PromptLayer,
    RunStatus,
    StepChanges,
    StepStatus,
    Tokens,
    utcnow,
)
from laneflow.domain.workers import LambdaRequest
from laneflow_dev.capacity import WriteMeter, laneflow_kind


def test_dynamodb_values_over_the_threshold_go_to_s3_and_every_item_stays_under_400_kb(dynamo: DynamoStore) -> None:
    # Given a result over the 64 KB threshold, and a conclusion and data under it
    run = new_run(dynamo, input={"document": big_text()}, steps=2)
    _, ref = claim(dynamo, run, 0)
    result, conclusion, data = big_text(seed="result"), big_text(50_000, seed="c"), big_text(50_000, seed="d")
    dynamo.end_attempt(
        ref,
        AttemptStatus.completed,
        step=StepChanges(status=StepStatus.completed, result=result, conclusion=conclusion, data=data),
    )

    # Then the result (kept as `r`) is a pointer to its text under the run's own prefix,
    # named by its field; the others stay
    (step,) = [i for i in raw_items() if i["sk"]["S"] == "S#00000000"]
    pointer = step["r"]["M"]["s3"]["S"]
    assert pointer.startswith(f"s3://{BUCKET}/{TENANT}/{run.id}/S/00000000/result-")
    assert blob(pointer) == result
    assert step["c"]["S"] == conclusion
    assert dynamo.get_step(TENANT, run.id, 0).result == result

    # When values under the threshold would together pass ~350 KB, the largest go to S3 too
    roomy = DynamoStore(TABLE, bucket=BUCKET, region=REGION, blob_threshold=10**9)
    sizes = {"instruction": 150_000, "result": 140_000, "conclusion": 130_000}
    texts = {field: big_text(size, seed=field) for field, size in sizes.items()}
    roomy.update_step(TENANT, run.id, 1, StepChanges(**texts))  # type: ignore[arg-type]
    (fresh,) = [i for i in raw_items() if i["sk"]["S"] == "S#00000001"]
    assert "M" in fresh["in"] and "S" in fresh["c"]
    # And when what an item already holds would take it past 400 KB, the write moves its own
    # large values to S3 and lands
    roomy.update_step(TENANT, run.id, 0, StepChanges(**texts))  # type: ignore[arg-type]
    assert all(len(json.dumps(item)) < 400 * 1024 for item in raw_items())
    for index in (0, 1):
        read = roomy.get_step(TENANT, run.id, index)
        assert (read.instruction, read.result, read.conclusion) == (texts["instruction"], texts["result"], texts["conclusion"])


def test_dynamodb_without_a_bucket_refuses_what_cannot_fit_an_item_and_keeps_what_can(dynamo: DynamoStore) -> None:
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


def test_dynamodb_live_lookups_read_the_sparse_index_never_the_table(dynamo: DynamoStore) -> None:
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
        return sorted(
            i["sk"]["S"]
            for i in aws_session().client("dynamodb", region_name=REGION).scan(TableName=TABLE, IndexName="live")["Items"]
        )

    assert live_index() == ["RUN", "S#00000000", "S#00000001"]
    # And a step leaves it with the last live thing it has
    dynamo.end_attempt(running, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert live_index() == ["RUN", "S#00000001"]
    dynamo.journal_settle(TENANT, live.id, "op-pending")
    assert live_index() == ["RUN"]


def test_dynamodb_a_step_item_keeps_a_bounded_part_of_its_history(dynamo: DynamoStore) -> None:
    from laneflow.adapters.store.dynamodb import ATTEMPTS_ON_STEP, CALLS_ON_STEP, JOURNAL_ON_STEP

    # Given a step claimed many times, each attempt with spans, one journal entry expiring at once
    run = new_run(dynamo)
    for i in range(1, 11):
        dynamo.journal_begin(TENANT, run.id, f"op-{i}", 0, ttl_s=-1 if i == 1 else 3600)
        _, ref = claim(dynamo, run, 0, op_id=f"op-{i}", expect_status=[StepStatus.pending, StepStatus.failed])
        calls = [ModelCall(id=f"turn-{i}-{k}", n=3 * i + k) for k in range(3)]
        dynamo.end_attempt(
            ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed), calls=calls
        )
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
    kept = journal_entry(dynamo, TENANT, run.id, "op-2")
    assert kept is not None and kept.attempt == 2


def test_dynamodb_a_step_stays_in_the_live_index_while_it_has_a_pending_entry(dynamo: DynamoStore) -> None:
    def live_index() -> list[str]:
        return sorted(
            i["sk"]["S"]
            for i in aws_session().client("dynamodb", region_name=REGION).scan(TableName=TABLE, IndexName="live")["Items"]
        )

    run = new_run(dynamo, status=RunStatus.completed)
    dynamo.journal_begin(TENANT, run.id, "op-a", 0)
    _, ref = claim(dynamo, run, 0, op_id="op-a")
    dynamo.journal_begin(TENANT, run.id, "op-b", 0)
    assert live_index() == ["S#00000000"]
    dynamo.consumed(reset=True)
    dynamo.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    assert live_index() == ["S#00000000"]  # op-b is still pending
    # (its cheap form, leaving the index, was refused: a unit all the same; the form that stays
    # wrote the step item and no index entry)
    assert dynamo.consumed()["write"]["end_attempt"] == 2
    dynamo.journal_settle(TENANT, run.id, "op-b")
    assert live_index() == []


def test_dynamodb_counts_the_write_units_each_step_operation_consumes(dynamo: DynamoStore) -> None:
    # Given a step run with every attempt-scoped write (small items, as the stub model makes them)
    run = new_run(dynamo, steps=1)
    dynamo.consumed(reset=True)
    dynamo.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0)
    _, ref = claim(
        dynamo, run, 0, op_id="exec-1:RunStep:0:0", worker=LambdaRequest(request_id=uuid.uuid4().hex, deadline=time.time())
    )
    dynamo.set_prompt_layers(
        ref,
        [
            PromptLayer(name=n, chars=812, sha256="3f2a9c1d0b7e", dynamic=n == "input")
            for n in ("persona", "shared", "task", "input")
        ],
    )
    dynamo.add_event(
        TENANT,
        run.id,
        0,
        Event(type="tool", text="search tides of the north sea", data={"tool": "search"}),  # type: ignore[arg-type]
        attempt=ref,
    )
    dynamo.put_call(
        ref, ModelCall(id="turn-1", ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300, cache_read=4100), stop="end_turn")
    )
    dynamo.heartbeat(ref, utcnow())
    dynamo.end_attempt(
        ref,
        AttemptStatus.completed,
        step=StepChanges(status=StepStatus.completed, result="the answer", cost_usd=0.01, finished_at=utcnow()),
    )
    # Then each costs what the item layout promises: one conditional write of the step item
    # (billed on the whole item: past 1 KB once it holds layers, worker and a span), a
    # transaction (2x per item) where one item cannot carry it (an event), plus index entries
    assert dynamo.consumed()["write"] == {
        "journal_begin": 2,  # the entry on the step item + the step's live-index entry
        "claim_attempt": 1,  # the step item alone (with its worker); its live-index entry stays as it is
        "set_prompt_layers": 1,
        "add_event": 4,  # transaction: the step's ConditionCheck + the event
        "put_call": 1,  # into the step item (still under 1 KB: its short names, lean span, compact layers)
        "heartbeat": 1,
        "end_attempt": 2,  # the step item; the step leaves the index (the run's cost is settled per group)
    }


STEP_OP = "exec-1:RunStep:0:0"


def drive_a_small_step(dynamo: DynamoStore, *, retry: bool) -> list[tuple[str, dict[str, float]]]:
    """The store calls the domain makes for one single-turn step (step.py): journal_begin,
    the claim with its worker and layers, the end with its span (and, with `retry`, an
    attempt that failed first and a second claim). Each call's write units, by operation."""
    run = new_run(dynamo, steps=1)
    worker = LambdaRequest(request_id=str(uuid.uuid4()), deadline=time.time() + 900)
    layers = [
        PromptLayer(name=n, chars=812, sha256="3f2a9c1d0b7e", dynamic=n == "input")
        for n in ("persona", "shared", "task", "input")
    ]
    span = ModelCall(
        id="turn-1", ms=812, ttft_ms=390, tokens=Tokens(input=120, output=300, cache_read=4100), stop="end_turn", cost_usd=0.01
    )
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
        measured(
            "end failed",
            lambda: dynamo.end_attempt(
                ref,  # type: ignore[has-type]
                AttemptStatus.failed,
                reason=error,
                step=StepChanges(error=error, cost_usd=0.01),
                calls=[span],
            ),
        )
        _, ref = measured("claim again", lambda: claim(dynamo, run, 0, expect_status=[StepStatus.running], worker=worker))  # type: ignore[misc]
        span = span.model_copy(update={"id": "turn-2", "n": 2, "attempt": 2})
    step = StepChanges(**done, cost_usd=0.02 if retry else 0.01, finished_at=utcnow())  # type: ignore[arg-type]
    measured("end", lambda: dynamo.end_attempt(ref, AttemptStatus.completed, step=step, calls=[span]))  # type: ignore[has-type]
    # What was written is what the step reads back as
    read = dynamo.get_step(TENANT, run.id, 0, detail=True)
    assert (read.status, read.result, read.prompt_layers, read.calls[-1]) == (StepStatus.completed, "the answer", layers, span)
    settled = journal_entry(dynamo, TENANT, run.id, STEP_OP)
    assert settled is not None and settled.status == JournalStatus.completed
    assert dynamo.running_attempts(TENANT) == [] and dynamo.journal_pending(TENANT) == []
    for label, units in costs:
        print(f"{label:>14}: {sum(units.values()):g} WCU {units}")
    print(f"{'step':>14}: {sum(sum(u.values()) for _, u in costs):g} WCU")
    return costs


def test_dynamodb_a_small_steps_happy_path_writes_five_units_in_three_single_item_writes(dynamo: DynamoStore) -> None:
    # (Before the step item carried its attempt, journal entry, layers and spans: 2 + 8 + 7 =
    # 17, the claim and the end each a transaction over the step, attempt, journal or span items;
    # before its short names, lean spans, compact layers and packed times, 2 + 1 + 3 = 6.)
    meter = WriteMeter(dynamo.client, label=dynamo.operation_now, kind=laneflow_kind)
    costs = drive_a_small_step(dynamo, retry=False)
    assert [(label, sum(units.values())) for label, units in costs] == [
        ("journal_begin", 2),  # the entry + the step's live-index entry
        ("claim", 1),  # the step item (< 1 KB with worker and layers); the index entry stays
        ("end", 2),  # the step item (still < 1 KB with its result and span) + the step leaves the live index
    ]
    # And DynamoDB's own rules, applied to the items as they were before and after each
    # request, say the same of the step's three writes: single-item updates, none refused
    writes = [w for w in meter.take() if w.label != "create_run"]
    assert [(w.label, w.request, w.table, w.index, w.refused) for w in writes] == [
        ("journal_begin", "UpdateItem", 1, 1, False),
        ("claim_attempt", "UpdateItem", 1, 0, False),
        ("end_attempt", "UpdateItem", 1, 1, False),
    ]


def test_dynamodb_a_small_step_with_one_retry_writes_ten_units(dynamo: DynamoStore) -> None:
    # (Before: 2 + 8 + 7 + 5 + 7 = 29; then 2 + 1 + 3 + 3 + 3 = 12.)
    meter = WriteMeter(dynamo.client, label=dynamo.operation_now, kind=laneflow_kind)
    costs = drive_a_small_step(dynamo, retry=True)
    assert [(label, sum(units.values())) for label, units in costs] == [
        ("journal_begin", 2),
        ("claim", 1),
        ("end failed", 2),  # the step item + it leaves the live index: nothing of it is live
        ("claim again", 2),  # the step item + it enters the index again
        ("end", 3),  # the step item (now past 1 KB with two attempts' records and spans: 2) + it leaves the index
    ]
    # And DynamoDB's rules, applied to the items before and after each request, say the same
    metered = [w for w in meter.take() if w.label != "create_run"]
    assert meter.total(metered) == sum(sum(units.values()) for _, units in costs) == 10
