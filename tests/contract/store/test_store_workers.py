"""Worker references: what works on an attempt (`Attempt.worker`) and what drives a run
(`Run.driver`) are models, kept as the same JSON text the stores kept before they were, so
a database written by an older version reads on."""

from __future__ import annotations

import json
import sqlite3

import pytest

from contract.store.backends import REGION, TABLE, TENANT, WORKERS, aws_session, claim, new_run
from laneflow.adapters.store import Store
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.records import RunChanges
from laneflow.domain.workers import LambdaRequest, LocalProcess, StepFunctionsExecution

# As the stores kept them before references were models: json.dumps(reference, sort_keys=True).
OLD_LOCAL = json.dumps({"kind": "local", "host": "desk", "pid": 4242, "started": "9001"}, sort_keys=True)
OLD_LAMBDA = json.dumps({"kind": "lambda", "request_id": "req-1", "deadline": 1767225600.5}, sort_keys=True)
OLD_SFN = json.dumps({"kind": "sfn", "execution": "arn:aws:states:us-east-1:1:execution:flow:e-1"}, sort_keys=True)


def stored_worker(store: Store, run_id: str, index: int, n: int) -> str:
    """The text the store keeps for attempt n's worker."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            (text,) = db.execute(
                "SELECT worker FROM attempts WHERE run_id = ? AND idx = ? AND n = ?", (run_id, index, n)
            ).fetchone()
        worker: str = text
        return worker
    item = (
        aws_session()
        .client("dynamodb", region_name=REGION)
        .get_item(TableName=TABLE, Key={"pk": {"S": f"T#{TENANT}#R#{run_id}"}, "sk": {"S": f"S#{index:08d}"}})["Item"]
    )
    worker_of_item: str = item[f"A{n}"]["M"]["w"]["S"]
    return worker_of_item


def store_as_before(store: Store, run_id: str, *, driver: str, worker: str) -> None:
    """Write the run's driver and attempt 1 of step 0's worker as text, as an older version did."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            db.execute("UPDATE runs SET driver = ? WHERE id = ?", (driver, run_id))
            db.execute("UPDATE attempts SET worker = ? WHERE run_id = ? AND idx = 0 AND n = 1", (worker, run_id))
        return
    client, pk = aws_session().client("dynamodb", region_name=REGION), {"S": f"T#{TENANT}#R#{run_id}"}
    client.update_item(
        TableName=TABLE,
        Key={"pk": pk, "sk": {"S": "RUN"}},
        UpdateExpression="SET #d = :v",
        ExpressionAttributeNames={"#d": "driver"},
        ExpressionAttributeValues={":v": {"S": driver}},
    )
    client.update_item(
        TableName=TABLE,
        Key={"pk": pk, "sk": {"S": "S#00000000"}},
        UpdateExpression="SET #a.#w = :v",
        ExpressionAttributeNames={"#a": "A1", "#w": "w"},
        ExpressionAttributeValues={":v": {"S": worker}},
    )


def test_a_worker_is_kept_as_the_text_an_older_version_kept(store: Store) -> None:
    run = new_run(store, steps=2)
    claim(store, run, 0, worker=LocalProcess(host="desk", pid=4242, started="9001"))
    claim(store, run, 1, worker=LambdaRequest(request_id="req-1", deadline=1767225600.5))
    assert stored_worker(store, run.id, 0, 1) == OLD_LOCAL
    assert stored_worker(store, run.id, 1, 1) == OLD_LAMBDA


def test_a_run_and_attempt_written_by_an_older_version_read_as_worker_models(store: Store) -> None:
    # Given a run and an attempt whose references an older version wrote as JSON text
    run = new_run(store)
    claim(store, run, 0)
    store_as_before(store, run.id, driver=OLD_SFN, worker=OLD_LOCAL)
    # Then they read as the models they name
    assert store.get_run(TENANT, run.id).driver == StepFunctionsExecution(
        execution="arn:aws:states:us-east-1:1:execution:flow:e-1"
    )
    assert store.get_attempt(TENANT, run.id, 0, 1).worker == WORKERS[0]
    assert [a.worker for a in store.list_attempts(TENANT, run.id)] == [WORKERS[0]]
    assert [a.worker for _, a in store.running_attempts(TENANT)] == [WORKERS[0]]
    assert [r.driver for r in store.active_runs(TENANT)] == [
        StepFunctionsExecution(execution="arn:aws:states:us-east-1:1:execution:flow:e-1")
    ]


@pytest.mark.parametrize(
    "text", ["pid:1", '{"kind": "mainframe"}', '{"kind": "lambda"}'], ids=["not-json", "unknown-kind", "incomplete"]
)
def test_a_stored_reference_that_names_no_known_worker_reads_as_none_and_the_record_reads_on(store: Store, text: str) -> None:
    run = new_run(store)
    claim(store, run, 0)
    store_as_before(store, run.id, driver=text, worker=text)
    assert store.get_run(TENANT, run.id).driver is None
    assert store.get_attempt(TENANT, run.id, 0, 1).worker is None


def test_a_driver_is_written_and_cleared_as_a_model(store: Store) -> None:
    run = new_run(store)
    me = LocalProcess(host="desk", pid=7, started=None)
    assert store.update_run(TENANT, run.id, RunChanges(driver=me)).driver == me
    assert store.get_run(TENANT, run.id, steps=False).driver == me
    assert store.update_run(TENANT, run.id, RunChanges(driver=None)).driver is None
