"""The stores the contract runs on, and the helpers its tests share.

A factory is a context manager that takes pytest's `tmp_path` and yields a fresh, empty
store whose `url` another process can open with `open_store`: a SQLite file, or a DynamoDB
table under moto built from template.yaml's own RunsTable (so the tests cannot drift from
what is deployed). Tests elsewhere that need a store of each kind import them from here.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from moto import mock_aws
from moto.server import ThreadedMotoServer

from laneflow.adapters.store import Store, open_store
from laneflow.adapters.store.provision import table_spec
from laneflow.domain.errors import NotFound
from laneflow.domain.records import Attempt, AttemptRef, JournalEntry, Run, Step, utcnow
from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution
from laneflow_dev.moto_support import serialized_dynamodb

TENANT = "local"
TEMPLATE = Path(__file__).resolve().parents[3] / "template.yaml"
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
def aws_session() -> boto3.session.Session:
    return boto3.session.Session()  # one for the whole run: a new one parses service models again


def create_runs_table() -> None:
    """The table as template.yaml's RunsTable declares it (key schema, indexes, billing), and
    the blob bucket."""
    aws_session().client("dynamodb", region_name=REGION).create_table(TableName=TABLE, **table_spec(TEMPLATE))
    aws_session().client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)


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


# The stores, by the name `--store-backend` takes. A test reaches them through the
# `store_kind` fixture (tests/conftest.py) or the contract suite's `store`, both of which run
# once per store that option names: never by iterating over this.
BACKENDS: dict[str, Callable[[Path], AbstractContextManager[Store]]] = {"sqlite": sqlite_store, "dynamodb": dynamodb_store}


def new_run(store: Store, *, steps: int = 3, tenant: str = TENANT, **fields: Any) -> Run:
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


def claim(store: Store, run: Run, index: int = 0, **kwargs: Any) -> tuple[Attempt, AttemptRef]:
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


def big_text(size: int = BIG, seed: str = "") -> str:
    """Text of `size` characters, not all ASCII (so bytes and characters differ)."""
    unit = f"{seed}tides é ✓ 潮汐 {uuid.uuid4().hex} "
    return (unit * (size // len(unit) + 1))[:size]


def raw_items() -> list[dict[str, Any]]:
    return aws_session().client("dynamodb", region_name=REGION).scan(TableName=TABLE)["Items"]


def blob(pointer: str) -> str:
    bucket, _, key = pointer.removeprefix("s3://").partition("/")
    return aws_session().client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def run_threads(count: int, work: Callable[[int], object]) -> list[object]:
    """Run `work(i)` on `count` threads released at once; each result or raised error."""
    start = threading.Barrier(count)
    results: list[object] = [None] * count

    def target(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except Exception as error:  # the test inspects it
            results[i] = error

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results
