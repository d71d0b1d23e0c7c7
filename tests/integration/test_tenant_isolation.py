"""Tenant isolation on the cloud path, under moto: the table from template.yaml, each tenant's
workspace in S3, runs started and answered through the API handler with API Gateway events,
driven through the deployed definition by the same handlers, steps on Claude's executor
against the local Messages API imitation (so a step really reads and writes its files).

Two tenants have a workspace of the same name with different contents and use the same
idempotency key. Every request tenant B makes is recorded at the AWS clients: none of them
names a key of tenant A (0 reads or writes across tenants), and A's objects are unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import moto_dynamodb_serialized, read_capture, started_drives
from moto import mock_aws
from pydantic import SecretStr
from test_cloud_path import SyncDrives, api_event, handler

from laneflow.adapters.aws import s3 as workspaces
from laneflow.adapters.aws.s3 import S3Workspaces
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, install
from laneflow_dev.imitation import MessagesImitation

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"
BUCKET = "laneflow-blobs"
KEY = "sk-test-isolation-0123456789"
A, B = "111111111111", "222222222222"
SAME_KEY = "publish-2026-11-30"
TENANT_KEY = re.compile(r"T#([^#]+)#(?:R#|RUNS$|LIVE#)")  # a partition key of the table, and its tenant


def desk(tenant: str) -> dict[str, str]:
    """The workspace `desk` as tenant `tenant` has it: same name, its own notes and knowledge."""
    return {
        "AGENTS.md": f"---\nmodel: claude-sonnet-4-6\n---\nThe desk of tenant {tenant}.\n",
        "agents/clerk/agent.md": "---\ndescription: Reads the notes and answers them.\nmax_turns: 6\n---\nYou are the clerk.\n",
        "knowledge/house.md": f"House rules of {tenant} only.\n",
        "storage/notes.md": f"private notes of tenant {tenant}\n",
        "flows/notes.yaml": (
            "steps:\n"
            "  - agent: clerk\n"
            "    instruction: |\n"
            "      Read the notes and answer them.\n"
            '      [[tool read_file {"path": "storage/notes.md"}]]\n'
            '      [[tool write_file {"path": "storage/reply.md", "content": "answered"}]]\n'
            "      [[reply The notes are answered.]]\n"
            '  - approval: "Publish the answer?"\n'
        ),
    }


class Requests:
    """Every AWS request the recorded clients make, as (service, operation, params)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.on = False

    def hook(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if self.on:
            self.calls.append((model.service_model.service_name, model.name, json.loads(json.dumps(params, default=str))))

    def watch(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build", self.hook)


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def foreign(calls: list[tuple[str, str, dict[str, Any]]], tenant: str) -> list[str]:
    """What in these requests names a key that is not `tenant`'s own."""
    bad = []
    for service, op, params in calls:
        if service == "dynamodb":
            owners = [m.group(1) for s in strings(params) if (m := TENANT_KEY.match(s))]
            bad += [f"{op}: a key of tenant {owner}" for owner in owners if owner != tenant]
        elif service == "s3":
            for name in ("Key", "Prefix"):
                key = params.get(name)
                if key is not None and not key.startswith((f"workspaces/{tenant}/", f"captures/{tenant}/", f"{tenant}/")):
                    bad.append(f"{op}: {key}")
    return bad


def objects(s3: Any, prefix: str) -> dict[str, str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in found}


def text(s3: Any, key: str) -> str:
    answer: str = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    return answer


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Services, Any, Requests]]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(workspaces, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(workspaces, "ATTEMPTS", tmp_path / "attempts")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with MessagesImitation(ttft_ms=5, token_ms=0, api_keys={KEY}) as model, mock_aws(), moto_dynamodb_serialized():
        assert "created" in " ".join(init_store(URL))
        s3 = boto3.client("s3", region_name="us-east-1")
        for tenant in (A, B):
            for rel, body in desk(tenant).items():
                s3.put_object(Bucket=BUCKET, Key=f"workspaces/{tenant}/desk/{rel}", Body=body.encode())
        settings = Settings(store_url=URL, anthropic_api_key=SecretStr(KEY), anthropic_base_url=model.url)
        svc = for_store(open_store(URL), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=model.url, backoff_s=0.01)
        svc.workspaces = S3Workspaces(BUCKET)
        svc.drives = SyncDrives(svc)
        requests = Requests()
        for client in (svc.store._db, svc.store._s3, svc.captures._s3()):  # type: ignore[attr-defined]
            requests.watch(client)
        # The workspaces' clients are made per operation from boto3's default session.
        default = boto3._get_default_session()
        default.events.register("before-parameter-build", requests.hook)
        install(svc)
        try:
            yield svc, s3, requests
        finally:
            default.events.unregister("before-parameter-build", requests.hook)
            install(None)


def call(route: str, tenant: str, *, run_id: str | None = None, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    """One API request of `tenant`'s through the API handler."""
    changes: dict[str, Any] = {}
    if run_id:
        path = {
            "get_run": f"/runs/{run_id}",
            "stop_run": f"/runs/{run_id}/stop",
            "answer_approval": f"/runs/{run_id}/approval",
            "redrive_run": f"/runs/{run_id}/redrive",
        }[route]
        changes.update(pathParameters={"run_id": run_id}, path=path)
    if route == "start_run":
        body = {"workspace": "desk", "flow": "notes", **({"idempotency_key": key} if key else {})}
    changes["body"] = None if body is None else json.dumps(body)
    event = api_event(route, **changes)
    event["requestContext"]["identity"]["accountId"] = tenant
    event["requestContext"]["accountId"] = tenant
    answer = handler("api")(event, None)
    return answer["statusCode"], json.loads(answer["body"]) if answer.get("body") else None


def start(tenant: str, key: str = SAME_KEY) -> dict[str, Any]:
    status, run = call("start_run", tenant, key=key)
    assert status == 201, run
    answer: dict[str, Any] = run
    return answer


def get(tenant: str, run_id: str) -> dict[str, Any]:
    status, run = call("get_run", tenant, run_id=run_id)
    assert status == 200, run
    answer: dict[str, Any] = run
    return answer


def read_notes(run: dict[str, Any], svc: Services) -> str:
    """The output of the run's read_file call, from its capture."""
    tool = next(e for e in run["steps"][0]["events"] if e["type"] == "tool" and e["data"]["tool"] == "read_file")
    answer: str = read_capture(svc, tool["data"]["capture"])["output"]
    return answer


def test_the_same_idempotency_key_gives_each_tenant_its_own_run(cloud: tuple[Services, Any, Requests]) -> None:
    svc, _, _ = cloud
    a, b = start(A), start(B)
    assert a["id"] != b["id"] and a["tenant"] == A and b["tenant"] == B
    # Each tenant's key replays its own run, never the other's.
    status, again = call("start_run", B, key=SAME_KEY)
    assert status == 200 and again["id"] == b["id"]
    status, again = call("start_run", A, key=SAME_KEY)
    assert status == 200 and again["id"] == a["id"]
    assert started_drives(svc) == [a["id"], b["id"]]


def test_each_tenants_step_reads_and_writes_only_its_own_workspace_files(cloud: tuple[Services, Any, Requests]) -> None:
    svc, s3, requests = cloud
    a = get(A, start(A)["id"])
    a_before = objects(s3, f"workspaces/{A}/")

    requests.on = True
    b = get(B, start(B)["id"])
    requests.on = False

    assert a["status"] == b["status"] == "awaiting-approval", (a.get("error"), b.get("error"))
    assert a["workspace"] == b["workspace"] == "desk"  # the workspace's name, not a folder's
    assert read_notes(a, svc) == f"private notes of tenant {A}\n"
    assert read_notes(b, svc) == f"private notes of tenant {B}\n"
    # What B's step wrote went to B's workspace only; A's objects are as they were.
    assert text(s3, f"workspaces/{B}/desk/storage/reply.md") == "answered"
    assert objects(s3, f"workspaces/{A}/") == a_before
    assert requests.calls and foreign(requests.calls, B) == []


def test_a_cloud_run_records_the_workspaces_name_not_its_sync_folders(cloud: tuple[Services, Any, Requests]) -> None:
    svc, _, _ = cloud
    started = start(A)
    assert started["workspace"] == "desk"
    assert svc.store.get_run(A, started["id"], steps=False).workspace == "desk"
    status, listed = call("list_runs", A)
    assert status == 200 and [r["workspace"] for r in listed["runs"]] == ["desk"]


def test_captures_are_under_each_tenants_own_prefix(cloud: tuple[Services, Any, Requests]) -> None:
    svc, s3, _ = cloud
    runs = {A: start(A)["id"], B: start(B)["id"]}
    captured = objects(s3, "captures/")
    assert captured
    for key in captured:
        _, tenant, run_id, _ = key.split("/")
        assert runs[tenant] == run_id, key
    for tenant, run_id in runs.items():
        refs = [e["data"]["capture"] for e in get(tenant, run_id)["steps"][0]["events"] if e["type"] == "tool"]
        assert len(refs) == 2 and all(f"captures/{ref}" in captured and ref.startswith(f"{tenant}/{run_id}/") for ref in refs)


@pytest.mark.slow
def test_tenant_b_cannot_see_stop_or_answer_tenant_as_run(cloud: tuple[Services, Any, Requests]) -> None:
    svc, _, requests = cloud
    a = start(A)
    b = start(B, key="another-key")

    requests.on = True
    assert call("get_run", B, run_id=a["id"])[0] == 404
    assert call("stop_run", B, run_id=a["id"])[0] == 404
    assert call("answer_approval", B, run_id=a["id"], body={"approve": True})[0] == 404
    assert call("answer_approval", B, run_id=a["id"], body={"approve": False})[0] == 404
    assert call("redrive_run", B, run_id=a["id"])[0] == 404
    status, listed = call("list_runs", B)
    requests.on = False
    assert status == 200 and [r["id"] for r in listed["runs"]] == [b["id"]]
    assert foreign(requests.calls, B) == []

    # A's run is untouched: still parked, no stop, no answer, no second drive.
    untouched = get(A, a["id"])
    assert untouched["status"] == "awaiting-approval" and untouched["stop_requested"] is False
    assert started_drives(svc) == [a["id"], b["id"]]
    # And A can still answer it: approving continues it in a new drive to its end.
    status, approved = call("answer_approval", A, run_id=a["id"], body={"approve": True})
    assert status == 200, approved
    assert get(A, a["id"])["status"] == "completed"
    assert get(B, b["id"])["status"] == "awaiting-approval"
    status, stopped = call("stop_run", B, run_id=b["id"])
    assert status == 200 and stopped["run"]["status"] == "failed"
    assert get(A, a["id"])["status"] == "completed"


def test_the_viewer_and_the_openapi_document_carry_no_tenants_runs(cloud: tuple[Services, Any, Requests]) -> None:
    a = start(A)
    for tenant in (A, B):
        for route in ("openapi", "viewer"):
            event = api_event("list_runs", path="/openapi.json" if route == "openapi" else "/", resource="/")
            event["requestContext"]["identity"]["accountId"] = tenant
            answer = handler("api")(event, None)
            assert answer["statusCode"] == 200
            assert a["id"] not in answer["body"] and A not in answer["body"]


def test_a_tenant_name_no_key_can_hold_is_a_400_naming_it_on_every_route(cloud: tuple[Services, Any, Requests]) -> None:
    _, _, requests = cloud
    a = start(A)
    requests.on = True
    for route, run_id, body in (
        ("start_run", None, None),
        ("list_runs", None, None),
        ("get_run", a["id"], None),
        ("stop_run", a["id"], None),
        ("answer_approval", a["id"], {"approve": True}),
        ("redrive_run", a["id"], None),
    ):
        status, error = call(route, f"{A}#RUNS", run_id=run_id, body=body)
        assert status == 400, (route, error)
        assert f"{A}#RUNS" in error["message"] and "'#'" in error["message"]
    requests.on = False
    assert requests.calls == []  # refused before any store key was built
    assert get(A, a["id"])["status"] == "awaiting-approval"
