"""What a step writes to DynamoDB, counted from outside the store: a meter on the store's
client (laneflow_dev.capacity) charges every write request by DynamoDB's item-size rules on
the items as the table (moto) holds them before and after it. A stub step's happy path writes
at most 6 units, and the store's own count says the same."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import boto3
import pytest
from helpers import DYNAMODB_REGION, DYNAMODB_TABLE, services_on, write_workspace

from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.domain.records import RunStatus
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run
from laneflow.wiring import local_engine
from laneflow_dev.capacity import WriteMeter, laneflow_kind

STEPS = 12
BUDGET = 6  # write units a step, the goal bench/store_cost.py holds at 100 steps


@pytest.fixture
def dynamo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    with services_on("dynamodb", tmp_path, monkeypatch) as svc:
        yield svc


def test_the_meter_charges_a_write_on_the_larger_of_the_item_before_and_after_it(dynamo: Services) -> None:
    client = boto3.client("dynamodb", region_name=DYNAMODB_REGION)
    meter = WriteMeter(client, label=lambda: "test", kind=laneflow_kind)
    key = {"pk": {"S": "T#t#R#run-1"}, "sk": {"S": "S#00000000"}}

    def update(expression: str, values: dict[str, Any] | None = None, **extra: Any) -> None:
        params: dict[str, Any] = {"TableName": DYNAMODB_TABLE, "Key": key, "UpdateExpression": expression, **extra}
        if values:
            params["ExpressionAttributeValues"] = values
        client.update_item(**params)

    client.put_item(TableName=DYNAMODB_TABLE, Item={**key, "status": {"S": "pending"}})
    update("SET body = :b", {":b": {"S": "x" * 1500}})  # grows past 1 KB: billed on the item after
    update("REMOVE body")  # shrinks: billed on the item before
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):  # refused: still billed, on what it found
        update(
            "SET body = :b",
            {":b": {"S": "y"}, ":s": {"S": "running"}},
            ConditionExpression="#s = :s",
            ExpressionAttributeNames={"#s": "status"},
        )
    update("SET vpk = :p, vsk = :k", {":p": {"S": "T#t#LIVE#STEP"}, ":k": {"S": "run-1#0"}})  # joins the live index
    client.transact_write_items(
        TransactItems=[
            {"ConditionCheck": {"TableName": DYNAMODB_TABLE, "Key": key, "ConditionExpression": "attribute_exists(pk)"}},
            {"Put": {"TableName": DYNAMODB_TABLE, "Item": {"pk": key["pk"], "sk": {"S": "T#00000000#E#1"}, "text": {"S": "hi"}}}},
        ]
    )
    client.delete_item(TableName=DYNAMODB_TABLE, Key=key)  # leaves the index with it
    client.delete_item(TableName=DYNAMODB_TABLE, Key=key)  # nothing there: one unit all the same
    assert [(w.request, w.action, w.kind, w.table, w.index, w.refused) for w in meter.take()] == [
        ("PutItem", "Put", "step", 1, 0, False),
        ("UpdateItem", "Update", "step", 2, 0, False),
        ("UpdateItem", "Update", "step", 2, 0, False),
        ("UpdateItem", "Update", "step", 1, 0, True),
        ("UpdateItem", "Update", "step", 1, 1, False),
        ("TransactWriteItems", "ConditionCheck", "step", 2, 0, False),
        ("TransactWriteItems", "Put", "event", 2, 0, False),
        ("DeleteItem", "Delete", "step", 1, 1, False),
        ("DeleteItem", "Delete", "step", 1, 0, False),
    ]
    meter.close()


def test_a_stub_steps_happy_path_writes_at_most_six_units_metered_and_as_the_store_counts(
    dynamo: Services, tmp_path: Path
) -> None:
    # Given a fan-out of stub steps on DynamoDB, the warm gate off, and a meter on the store's client
    store = cast(DynamoStore, dynamo.store)
    meter = WriteMeter(store.client, label=store.operation_now, kind=laneflow_kind)
    ws = write_workspace(
        tmp_path / "ws",
        {"worker": {"stub": "cost: 0.001\nDone with {item}."}},
        {"each": {"steps": [{"agent": "worker", "each": [f"item-{i}" for i in range(STEPS)]}]}},
    )
    run = create_run(dynamo, ws, "each", options={"gate": False})
    meter.take()
    store.consumed(reset=True)

    # When the run is driven to its end through the real definition
    done = local_engine(dynamo).drive(run.tenant, run.id, tick_s=0.02).run
    writes, counted = meter.take(), store.consumed()["write"]
    assert done.status == RunStatus.completed, done.error

    # Then each step's own item was written three times, with an index entry in and out: the
    # pending journal entry, the claim, the end; nothing was refused. A completed stub step's
    # item is about 965 bytes, so a write is one unit, and a step whose item passes 1 KB (a
    # longer item, worker or operation id) pays one more: at most one such write in three.
    by_step: defaultdict[str, list[tuple[str, str, int, int]]] = defaultdict(list)
    for w in writes:
        if w.kind == "step":
            by_step[w.key].append((w.label, w.request, w.table, w.index))
    assert len(by_step) == STEPS
    for each in by_step.values():
        assert [(label, request, index) for label, request, _, index in each] == [
            ("journal_begin", "UpdateItem", 1),
            ("claim_attempt", "UpdateItem", 0),
            ("end_attempt", "UpdateItem", 1),
        ]
        assert sum(table for *_, table, _ in each) <= 4
    assert sum(1 for each in by_step.values() for *_, table, _ in each if table > 1) <= STEPS // 4
    assert not [w for w in writes if w.refused]
    # And with the run's own writes (its start, its end, the group's handoff), at most 6 a step
    metered = meter.total(writes)
    assert metered / STEPS <= BUDGET
    # And the store's own count, from the sizes it writes, agrees with the meter
    # (the store sizes an update's item by what it read before it, so near 1 KB it may charge
    # a unit the item, as it stood, did not cost)
    assert sum(counted.values()) == pytest.approx(metered, abs=0.1 * STEPS)
    meter.close()
