"""A damaged record already in the store never stops reading the others.

A run whose stored JSON does not parse (a NaN written before entrances refused it, a hand
edit) is left out of lists and of reconcile, and reading it says which run and which field.
Each test runs on both stores: SQLite (the damage written with sqlite3, as an older version
or a person would have) and DynamoDB under moto (an item whose JSON does not parse).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from contract.store.backends import BACKENDS, REGION, TABLE, TENANT, claim, new_run, sqlite_store
from helpers import FIXTURES

from laneflow.adapters.store import Store
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.adapters.workers import Liveness
from laneflow.domain.errors import RecordDamaged
from laneflow.domain.records import RunChanges, RunStatus
from laneflow.domain.workers import LambdaRequest
from laneflow.entrypoints.cli import main
from laneflow.settings import Settings
from laneflow.usecases.reconcile import reconcile
from laneflow.wiring import for_store

Poison = Callable[[Store, str, str], None]  # (store, run id, what: "input" | "step") -> None

GONE_WORKER = LambdaRequest(request_id="gone", deadline=0)  # a Lambda long past its deadline


def _poison_sqlite(store: Store, run_id: str, what: str) -> None:
    assert isinstance(store, SqliteStore)
    db = sqlite3.connect(store.path)
    with db:
        if what == "input":
            db.execute("UPDATE runs SET input = ? WHERE id = ?", ('{"a": NaN}', run_id))
        else:
            db.execute("UPDATE steps SET data = ? WHERE run_id = ? AND idx = 0", ('{"score": Infinity}', run_id))
    db.close()


def _poison_dynamodb(store: Store, run_id: str, what: str) -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    pk = f"T#{TENANT}#R#{run_id}"
    sk, attr = ("RUN#INPUT", "input") if what == "input" else ("S#00000000", "data")
    client.update_item(
        TableName=TABLE,
        Key={"pk": {"S": pk}, "sk": {"S": sk}},
        UpdateExpression="SET #a = :v",
        ExpressionAttributeNames={"#a": attr},
        ExpressionAttributeValues={":v": {"S": '{"a": NaN, "cut off'}},
    )


POISONS: dict[str, Poison] = {"sqlite": _poison_sqlite, "dynamodb": _poison_dynamodb}


@pytest.fixture
def damaged(store_kind: str, tmp_path: Path) -> Iterator[tuple[Store, Poison]]:
    poison = POISONS[store_kind]
    with BACKENDS[store_kind](tmp_path) as store:
        yield store, poison


def test_a_run_whose_input_holds_nan_is_left_out_of_the_list_and_the_others_are_listed(damaged: tuple[Store, Poison]) -> None:
    store, poison = damaged
    good, bad, later = (new_run(store, id=f"run-{name}") for name in ("good", "bad", "later"))
    poison(store, bad.id, "input")

    listed = [r.id for r in store.list_runs(TENANT)]

    assert listed == [later.id, good.id]


def test_reading_a_damaged_run_is_a_clear_error_naming_the_run_and_the_field(damaged: tuple[Store, Poison]) -> None:
    store, poison = damaged
    bad = new_run(store, id="run-bad")
    poison(store, bad.id, "input")

    with pytest.raises(RecordDamaged) as err:
        store.get_run(TENANT, bad.id)

    assert "run 'run-bad'" in str(err.value) and "input" in str(err.value)
    # Its input read by itself says the same; the run read without its input reads
    with pytest.raises(RecordDamaged) as err:
        store.get_run_input(TENANT, bad.id)
    assert "run 'run-bad'" in str(err.value) and "input" in str(err.value)
    assert store.get_run(TENANT, bad.id, steps=False, input=False).id == bad.id


def test_a_damaged_step_fails_reading_its_run_naming_the_step_and_the_run_is_still_listed(damaged: tuple[Store, Poison]) -> None:
    store, poison = damaged
    run = new_run(store, id="run-step")
    poison(store, run.id, "step")

    with pytest.raises(RecordDamaged) as err:
        store.get_run(TENANT, run.id)

    assert "step 0" in str(err.value) and "data" in str(err.value)
    assert [r.id for r in store.list_runs(TENANT)] == [run.id]  # its head still reads


def test_reconcile_passes_over_a_damaged_run_and_goes_on_with_the_rest(damaged: tuple[Store, Poison], tmp_path: Path) -> None:
    # Given two runs whose step 0 was claimed by a worker that is gone, and one of them damaged
    store, poison = damaged
    svc = for_store(store, Settings(capture_dir=str(tmp_path / "captures")))
    good, bad = new_run(store, id="run-good"), new_run(store, id="run-bad")
    for run in (good, bad):
        claim(store, run, 0, worker=GONE_WORKER)
        store.update_run(TENANT, run.id, RunChanges(status=RunStatus.running))
    poison(store, bad.id, "input")
    redriven: list[str] = []

    # When reconcile runs
    report = reconcile(svc, Liveness(), redrive=lambda run: redriven.append(run.id))

    # Then the good run's attempt is interrupted and the run re-driven; the bad one is said
    assert [(a.run_id, a.outcome) for a in report.attempts] == [(good.id, "interrupted")]
    assert redriven == [good.id]
    assert [run_id for run_id, _ in report.damaged] == [bad.id]
    assert any(bad.id in line and "input" in line for line in report.lines())


def test_runs_show_reconcile_and_run_keep_working_on_a_store_with_a_nan_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a SQLite store holding one good run and one whose input is NaN
    url = f"sqlite:///{tmp_path / 'laneflow.db'}"
    with sqlite_store(tmp_path) as store:
        new_run(store, id="run-good")
        new_run(store, id="run-bad")
        _poison_sqlite(store, "run-bad", "input")
    capsys.readouterr()

    # Then listing shows the good one, `show` of the bad one is one clear line, reconcile ends
    assert main(["runs", "--store", url, "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ["run-good"]
    assert main(["show", "run-bad", "--store", url]) == 1
    err = capsys.readouterr().err
    assert "run 'run-bad' cannot be read from the store: its input is not valid JSON" in err and "Traceback" not in err
    assert main(["show", "run-good", "--store", url]) == 0
    assert main(["reconcile", "--store", url]) == 0
    # and a new run starts, runs and is listed beside the good one
    sem = FIXTURES / "ws_semantics"
    assert main(["run", str(sem), "handoff", "--input", '{"things": ["a"]}', "--store", url, "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert main(["runs", "--store", url, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
