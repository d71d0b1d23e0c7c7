"""The cloud path, proven under moto: the table and bucket from template.yaml, the workspace
in S3, a run started through the API handler with an API Gateway event, driven through the
deployed definition (substitutions resolved) by the same handlers, on the DynamoDB and S3
stores; the record read back through the API. Plus the handlers under Powertools, as in
Lambda."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import EXAMPLES, ROOT, moto_dynamodb_serialized, started_drives
from moto import mock_aws

from laneflow.adapters.aws.eventbridge import EventBridgeOnEnd
from laneflow.adapters.aws.s3 import S3Workspaces
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.ports import DriveStarter, Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, install, local_engine

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"


def handler(name: str) -> Callable[[Any, Any], Any]:
    spec = importlib.util.spec_from_file_location(f"cloud_{name}", ROOT / "functions" / name / "app.py")
    assert spec is not None and spec.loader is not None  # the file exists
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answer: Callable[[Any, Any], Any] = module.handler
    return answer


class SyncDrives:
    """Starts a drive as StartExecution would, and waits for it (the test's clock)."""

    def __init__(self, svc: Services) -> None:
        self.started: list[Any]
        self.svc, self.started = svc, []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append(run_id)
        return local_engine(self.svc).drive(tenant, run_id, tick_s=0.02).execution_arn


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Services]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with mock_aws(), moto_dynamodb_serialized():
        assert "created" in " ".join(init_store(URL))
        s3 = boto3.client("s3", region_name="us-east-1")
        for example in ("newsroom", "scouts", "almanac"):
            for path in (EXAMPLES / example).rglob("*"):
                if path.is_file():
                    s3.upload_file(
                        str(path),
                        "laneflow-blobs",
                        f"workspaces/123456789012/{example}/{path.relative_to(EXAMPLES / example).as_posix()}",
                    )
        events = boto3.client("events", region_name="us-east-1")
        events.create_event_bus(Name="laneflow-runs")
        svc = for_store(open_store(URL), Settings(store_url=URL, tenant="123456789012"))
        svc.workspaces = S3Workspaces("laneflow-blobs")
        svc.drives = SyncDrives(svc)
        told = []
        bus = EventBridgeOnEnd("laneflow-runs", client=events)
        svc.on_end = lambda run: (told.append(run.id), bus(run))  # type: ignore[assignment, func-returns-value]
        svc.told = told  # type: ignore[attr-defined]
        install(svc)
        yield svc
        install(None)


def api_event(name: str, **changes: Any) -> dict[str, Any]:
    event = json.loads((ROOT / "events" / f"api_{name}.json").read_text())
    event.update(changes)
    answer: dict[str, Any] = event
    return answer


def start(api: Callable[[Any, Any], Any], body: dict[str, Any]) -> str:
    """Start a run through the API handler: its id (a 201)."""
    started = api(api_event("start_run", body=json.dumps(body)), None)
    assert started["statusCode"] == 201, started["body"]
    answer: str = json.loads(started["body"])["id"]
    return answer


def record_of(api: Callable[[Any, Any], Any], run_id: str) -> dict[str, Any]:
    """The run's record through the API handler (a 200)."""
    got = api(api_event("get_run", pathParameters={"run_id": run_id}, path=f"/runs/{run_id}"), None)
    assert got["statusCode"] == 200, got["body"][:300]
    answer: dict[str, Any] = json.loads(got["body"])
    return answer


@pytest.mark.slow
def test_a_flow_runs_end_to_end_on_the_cloud_path(cloud: Services) -> None:
    api = handler("api")
    body = {"workspace": "newsroom", "flow": "brief", "input": {"topics": ["tides", "reefs", "vents"]}}
    run_id = start(api, body)
    assert started_drives(cloud) == [run_id]

    record = record_of(api, run_id)
    assert record["status"] == "completed", record.get("error")
    assert len(record["steps"]) == 6 and all(
        s["status"] == "completed" and s["prompt_layers"] and s["calls"] for s in record["steps"]
    )
    assert record["steps"][-1]["data"]["slug"] == "ocean-records"
    assert record["tenant"] == "123456789012"  # from the caller's identity

    # The record is in DynamoDB (a fresh store reads it), the workspace came from S3.
    fresh = open_store(URL).get_run("123456789012", run_id)
    assert fresh.status == "completed" and fresh.workspace_uri == "s3://laneflow-blobs/workspaces/123456789012/newsroom/"
    assert cloud.told == [run_id]  # type: ignore[attr-defined]  # "run finished" went to the bus


@pytest.mark.slow
def test_colleagues_talk_through_the_table_on_the_cloud_path(cloud: Services) -> None:
    """examples/scouts from S3, started through the API handler and driven by the same
    handlers on DynamoDB: the message is kept in the table and both records show it."""
    api = handler("api")
    run_id = start(api, {"workspace": "scouts", "flow": "survey"})
    record = record_of(api, run_id)
    assert record["status"] == "completed", record.get("error")
    north, south = record["steps"][:2]
    assert any(e["type"] == "peer" and e["text"].startswith("message to south-scout (step 1)") for e in north["events"])
    assert any(e["type"] == "peer" and e["text"].startswith("delivered to its next turn") for e in south["events"])
    [note] = open_store(URL).get_inbox("123456789012", run_id, 1)
    assert note.from_agent == "north-scout" and "harbours" in note.text


@pytest.mark.slow
def test_the_agents_reach_works_on_the_cloud_path(cloud: Services) -> None:
    """examples/almanac from S3 through the API handler on DynamoDB: each editor step
    delegates to the researcher, whose turns are spans of the step, and the researcher's
    search of the knowledge and its MCP server's tide table reach its reply."""
    api = handler("api")
    run_id = start(api, {"workspace": "almanac", "flow": "almanac", "input": {"ports": ["Brest", "Dover"]}})
    record = record_of(api, run_id)
    assert record["status"] == "completed", record.get("error")
    for step, port in zip(record["steps"], ["Brest", "Dover"], strict=True):
        assert [c.get("delegate") for c in step["calls"]].count("researcher") == 2
        tools = {e["data"]["tool"]: e for e in step["events"] if e["type"] == "tool"}
        assert tools["delegate"]["data"].get("delegate") is None  # the editor's own call
        assert tools["search"]["data"]["delegate"] == "researcher"
        assert tools["mcp__tides__high_water"]["data"]["delegate"] == "researcher"
        assert not tools["mcp__tides__high_water"]["data"].get("is_error"), tools["mcp__tides__high_water"]
        assert step["conclusion"] == f"Wrote the almanac entry for {port} from the researcher's findings."


@pytest.mark.slow
def test_another_tenants_run_is_a_404_and_a_malformed_body_a_400(cloud: Services) -> None:
    api = handler("api")
    body = {"workspace": "newsroom", "flow": "brief", "input": {"topics": ["tides"]}}
    run_id = json.loads(api(api_event("start_run", body=json.dumps(body)), None)["body"])["id"]
    other = api_event("get_run", pathParameters={"run_id": run_id}, path=f"/runs/{run_id}")
    other["requestContext"]["identity"]["accountId"] = "999999999999"
    assert api(other, None)["statusCode"] == 404
    bad = api(api_event("start_run", body="{not json"), None)
    assert bad["statusCode"] == 400


def test_the_handlers_run_under_powertools_as_in_lambda(tmp_path: Path) -> None:
    """In Lambda (AWS_LAMBDA_FUNCTION_NAME set) the RunStep handler logs JSON lines carrying
    the run id, step and attempt, and flushes EMF metrics (step cost, cache tokens); its
    output is the contract's."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "functions" / "run_step")!r})
from laneflow.wiring import for_store, install
from laneflow.settings import Settings
from laneflow.adapters.store import open_store
from laneflow.adapters.workers import local_worker
from laneflow.usecases.start_run import create_run
from laneflow.usecases.start_drive import start_drive
from laneflow.domain.messages import StartDriveRequest
svc = for_store(open_store("sqlite:///{tmp_path / "p.db"}"), Settings())
run = create_run(svc, {str(ROOT / "tests" / "fixtures" / "ws_control")!r}, "rescue")
start_drive(svc, StartDriveRequest(tenant="local", run_id=run.id), worker=local_worker())
install(svc)
import app
class Ctx:
    function_name = "RunStepFunction"; memory_limit_in_mb = 1024; aws_request_id = "req-1"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:RunStepFunction"
    def get_remaining_time_in_millis(self): return 60000
out = app.handler({{"run": {{"tenant": "local", "run_id": run.id, "drive": 1}}, "group": 0, "lane": "researcher@stub",
                   "step": {{"index": 0, "role": "solo"}}, "op": {{"execution": "e", "state": "RunStarter"}}}}, Ctx())
print("RESULT " + json.dumps(out))
"""
    env = {
        **os.environ,
        "AWS_LAMBDA_FUNCTION_NAME": "RunStepFunction",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result == {"index": 0, "status": "completed", "attempts": 1}
    logs = [line for line in lines if line.get("message") == "handled"]
    assert logs and logs[0]["run_id"] and logs[0]["step"] == 0 and logs[0]["attempt"] == 1
    assert logs[0]["function_name"] == "RunStepFunction" and logs[0]["level"] == "INFO"
    emf = [line for line in lines if "_aws" in line]
    names = {m["Name"] for m in emf[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "laneflow"
    assert {"StepCostUSD", "StepDuration", "CacheReadTokens", "CacheWriteTokens", "ColdPrefixesWritten"} <= names
    assert emf[0]["StepCostUSD"] == [0.01] or emf[0]["StepCostUSD"] == 0.01


@pytest.mark.slow
def test_a_completed_run_makes_its_chained_run_from_the_s3_workspace_and_the_api_lists_it(
    cloud: Services, tmp_path: Path
) -> None:
    """EndRun makes the chained run (`then:`) through the same keyed start as the API's,
    reading the flow from the tenant's S3 workspace; its drive is started once (the cloud's
    StartExecution returns at once: here it is recorded, and run after), and the API's
    record of the first run lists it as `then_run`."""
    from helpers import write_workspace

    ws = write_workspace(
        tmp_path / "chain-ws",
        {"writer": {"stub": "The brief."}, "publisher": {"stub": "Published."}},
        {
            "brief": {"steps": [{"agent": "writer"}], "then": {"flow": "publish", "input": {"text": "{result.writer}"}}},
            "publish": {"steps": [{"agent": "publisher", "instruction": "Publish {input.text}"}]},
        },
    )
    s3 = boto3.client("s3", region_name="us-east-1")
    for path in ws.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "laneflow-blobs", f"workspaces/123456789012/desk/{path.relative_to(ws).as_posix()}")
    assert cloud.drives is not None
    drives: DriveStarter = cloud.drives  # the real one, kept for what Recording passes on
    later: list[str] = []

    class Recording:
        started: list[str] = []

        def start(self, tenant: str, run_id: str) -> str:
            self.started.append(run_id)
            if len(self.started) == 1:
                return drives.start(tenant, run_id)
            later.append(run_id)  # a chained run: StartExecution returns at once
            return "arn:later"

    cloud.drives = Recording()
    api = handler("api")
    run_id = start(api, {"workspace": "desk", "flow": "brief"})
    record = record_of(api, run_id)
    assert record["status"] == "completed" and record["then_run"] and later == [record["then_run"]]
    drives.start("123456789012", later[0])
    chained = record_of(api, later[0])
    assert chained["status"] == "completed" and chained["input"] == {"text": "The brief."}
    assert chained["steps"][0]["instruction"] == "Publish The brief."


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (["storage/notes.md", "storage/notes.md/inner.md"], "storage/notes.md"),
        (["storage/" + "n" * 256 + ".md"], "n" * 256),
        (["storage//notes.md", "storage/notes.md"], "storage//notes.md"),
    ],
    ids=["a-file-and-a-folder-of-one-name", "a-name-over-255-bytes", "an-empty-part"],
)
def test_a_workspace_key_that_cannot_be_laid_out_is_a_400_naming_it_and_nothing_is_downloaded(
    cloud: Services, keys: Any, named: Any
) -> None:
    """S3 holds keys a file system cannot (a file and a folder of one name; a name part past
    255 bytes): starting a run on such a workspace is a 400 naming the key, no run is made,
    and nothing of the download is left under /tmp."""
    from laneflow.adapters.aws import s3 as workspaces

    s3 = boto3.client("s3", region_name="us-east-1")
    for key in keys:
        s3.put_object(Bucket="laneflow-blobs", Key=f"workspaces/123456789012/newsroom/{key}", Body=b"notes")

    def downloaded() -> set[Any]:
        return set(workspaces.CACHE.rglob("*")) if workspaces.CACHE.exists() else set()

    before = downloaded()
    api = handler("api")
    answer = api(
        api_event("start_run", body=json.dumps({"workspace": "newsroom", "flow": "brief", "input": {"topics": ["tides"]}})), None
    )
    assert answer["statusCode"] == 400, answer["body"]
    body = json.loads(answer["body"])
    assert named in body["message"] and "nothing was downloaded" in body["message"], body
    assert body["problems"] and named in body["problems"][0]["file"] + body["problems"][0]["message"]
    assert started_drives(cloud) == [] and open_store(URL).list_runs("123456789012") == []
    assert downloaded() == before  # not a file of it, not a folder half made
