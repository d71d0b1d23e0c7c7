"""A store the infrastructure cannot serve now raises `TransientError`, the error the state
machine's Retry blocks retry by name, and writes nothing: a DynamoDB throttle or failure
that outlasts the client's own retries, a SQLite database locked past its busy timeout."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from contract.store.backends import TENANT, claim, new_run, snapshot
from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.errors import TransientError
from laneflow.domain.records import Event, Run, RunChanges, RunStatus
from laneflow.paths import project_root

THROTTLES = [
    ("ProvisionedThroughputExceededException", 400),
    ("ThrottlingException", 400),
    ("RequestLimitExceeded", 400),
    ("InternalServerError", 500),
    ("ServiceUnavailable", 503),
]


def refuse_at_send(store: DynamoStore, operation: str, error: dict[str, Any], status: int, **reply: object) -> list[str]:
    """From now on the store's own client fails `operation` as DynamoDB answers it: the
    ClientError botocore raises for that reply (`reply`: more of it), at the send step (no
    request reaches moto). Returns the operations refused so far."""
    refused: list[str] = []

    def send(**_: object) -> None:
        refused.append(operation)
        raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}, **reply}, operation)  # type: ignore[typeddict-item]

    store._db.meta.events.register(f"before-send.dynamodb.{operation}", send)
    return refused


def test_the_state_machine_retries_transient_errors_by_that_name() -> None:
    definition = json.loads((project_root() / "statemachines" / "flow.asl.json").read_text())
    retried: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for retry in node.get("Retry", []):
                retried.update(retry["ErrorEquals"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(definition)
    assert TransientError.__name__ in retried


@pytest.mark.parametrize(("code", "status"), THROTTLES, ids=[code for code, _ in THROTTLES])
def test_a_dynamodb_throttle_or_failure_on_a_conditional_write_is_a_transient_error_and_writes_nothing(
    dynamo: DynamoStore, code: Any, status: Any
) -> None:
    run = new_run(dynamo)
    before = snapshot(dynamo, run)
    refused = refuse_at_send(dynamo, "UpdateItem", {"Code": code, "Message": "slow down"}, status)
    with pytest.raises(TransientError) as raised:
        claim(dynamo, run, 0)
    assert type(raised.value) is TransientError and code in str(raised.value)
    assert refused == ["UpdateItem"]
    assert snapshot(dynamo, run) == before


@pytest.mark.parametrize("operation", ["Query", "BatchGetItem", "GetItem"])
def test_a_throttled_read_is_a_transient_error(dynamo: DynamoStore, operation: str) -> None:
    run = new_run(dynamo)
    refuse_at_send(dynamo, operation, {"Code": "ProvisionedThroughputExceededException", "Message": "over capacity"}, 400)
    with pytest.raises(TransientError):
        {  # type: ignore[no-untyped-call]
            "Query": lambda: dynamo.get_run(TENANT, run.id),
            "BatchGetItem": lambda: dynamo.list_runs(TENANT),
            "GetItem": lambda: dynamo.get_step(TENANT, run.id, 0),
        }[operation]()


def test_a_transaction_cancelled_by_a_throttle_is_a_transient_error_and_writes_nothing(dynamo: DynamoStore) -> None:
    run = new_run(dynamo)
    _, ref = claim(dynamo, run, 0)
    before = snapshot(dynamo, run)
    cancelled = {"Code": "TransactionCanceledException", "Message": "Transaction cancelled [None, ThrottlingError]"}
    reasons = [{"Code": "None"}, {"Code": "ThrottlingError"}]
    refuse_at_send(dynamo, "TransactWriteItems", cancelled, 400, CancellationReasons=reasons)
    with pytest.raises(TransientError):
        dynamo.add_event(TENANT, run.id, 0, Event(text="a fenced line"), attempt=ref)
    assert snapshot(dynamo, run) == before


def test_a_sqlite_database_locked_past_the_busy_timeout_is_a_transient_error_and_the_write_lands_once_it_is_free(
    tmp_path: Path,
) -> None:
    # Given a store with a short busy timeout, and another connection holding the write lock
    path = tmp_path / "laneflow.db"
    store = SqliteStore(path, busy_timeout_s=0.2)
    run = new_run(store)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # When this store writes
        with pytest.raises(TransientError) as raised:
            store.update_run(TENANT, run.id, RunChanges(status=RunStatus.running))
        # Then it says so, naming its timeout, and wrote nothing; reads go on meanwhile (WAL)
        assert type(raised.value) is TransientError
        assert "locked" in str(raised.value) and "past 0.2 s" in str(raised.value)
        assert store.get_run(TENANT, run.id).status == RunStatus.queued
    finally:
        holder.execute("ROLLBACK")
    # And a write that meets the lock waits for it: a store with a long timeout, its
    # transaction begun (SQLite traced the BEGIN IMMEDIATE) while the lock is held, is still
    # waiting while it is held and lands once the holder lets go
    patient = SqliteStore(path, busy_timeout_s=60)
    begun = threading.Event()
    outcome: dict[str, Run | Exception] = {}
    tries: list[str] = []

    def traced(sql: str) -> None:
        if sql == "BEGIN IMMEDIATE":
            tries.append(sql)
            begun.set()

    patient._conn.set_trace_callback(traced)

    def write() -> None:
        try:
            outcome["run"] = patient.update_run(TENANT, run.id, RunChanges(status=RunStatus.running))
        except Exception as error:
            outcome["error"] = error

    holder.execute("BEGIN IMMEDIATE")
    writer = threading.Thread(target=write, daemon=True)
    try:
        writer.start()
        assert begun.wait(30), "the write never began its transaction"
        writer.join(0.5)  # time for a write that does not wait to end (it would fail at once)
        assert writer.is_alive() and not outcome, f"the write ended while the lock was held: {outcome}"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    writer.join(30)
    assert not writer.is_alive(), "the write never ended once the lock was free"
    updated = outcome.get("run")
    assert "error" not in outcome and isinstance(updated, Run) and updated.status == RunStatus.running, outcome
    assert store.get_run(TENANT, run.id).status == RunStatus.running
    # It waited in short pauses of its own, asking again (SQLite's busy handler would have
    # slept 25-100 ms at a time inside one try), and its reads keep the busy timeout.
    assert len(tries) > 10, f"the write asked for the lock {len(tries)} times in 0.5 s"
    assert patient._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 60_000
    patient.close()
    store.close()
