"""The model's key is read where it is used. Only the functions that run steps are given the
name of its Secrets Manager secret (and the policy to read it); building the services reads
nothing, and a function that only starts, plans, parks, ends or reconciles runs never reads
it. A step reads it the first time it needs it, once per container.

Under moto: the secret is real (moto's Secrets Manager), the services are built from the
environment as a Lambda container builds them, the handlers are the deployed ones, and the
Claude steps call the local Messages API imitation, which accepts only the secret's key.
Every GetSecretValue is counted by a botocore hook, by the handler it was made under."""

from __future__ import annotations

import importlib.util
import json
import shutil
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import FIXTURES, ROOT, moto_dynamodb_serialized
from moto import mock_aws

from laneflow.adapters.aws.secrets import read_model_key
from laneflow.adapters.engine.template import Template
from laneflow.adapters.store.provision import init_store
from laneflow.domain.errors import ModelNotConfigured
from laneflow.domain.records import RunStatus, StepStatus
from laneflow.settings import settings
from laneflow.wiring import install, local_engine, services
from laneflow_dev.imitation import MessagesImitation

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"
SECRET = "laneflow/anthropic"
KEY = "sk-ant-from-secrets-manager-0123456789abcdef"
TENANT = "123456789012"  # the caller's account in events/api_*.json
FUNCTIONS = ROOT / "functions"


def handler(name: str) -> Callable[[Any, Any], Any]:
    spec = importlib.util.spec_from_file_location(f"key_{name}", FUNCTIONS / name / "app.py")
    assert spec is not None and spec.loader is not None  # the file exists
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answer: Callable[[Any, Any], Any] = module.handler
    return answer


def api_event(name: str, **changes: Any) -> dict[str, Any]:
    event = json.loads((ROOT / "events" / f"api_{name}.json").read_text())
    event.update(changes)
    answer: dict[str, Any] = event
    return answer


class SecretReads:
    """Each GetSecretValue call, named by the innermost handler (functions/<name>/app.py) on
    the calling thread's stack; None when no handler made it."""

    def __init__(self) -> None:
        self.by: list[str | None] = []

    def __call__(self, **_: object) -> None:
        for frame in reversed(traceback.extract_stack()):
            path = Path(frame.filename)
            if path.name == "app.py" and path.parent.parent == FUNCTIONS:
                self.by.append(path.parent.name)
                return
        self.by.append(None)


class StartedDrives:
    """What the API and reconcile asked to drive (the test drives them itself)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append(run_id)
        return f"arn:aws:states:us-east-1:{TENANT}:execution:flow:{run_id}"


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=50, token_ms=0, api_keys={KEY}) as server:
        yield server


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: MessagesImitation) -> Iterator[SecretReads]:
    """A step runner's environment (the secret's name set, no key), moto behind it, and the
    workspace in S3 (ws_claude plus a flow that only parks)."""
    ws = tmp_path / "claude"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    (ws / "flows" / "ask.yaml").write_text('description: only a person\'s answer\nsteps:\n  - approval: "Go on?"\n')
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TMPDIR": str(tmp_path),
        "LANEFLOW_STORE": URL,
        "LANEFLOW_WORKSPACES": "s3://laneflow-blobs/workspaces",
        "LANEFLOW_ANTHROPIC_SECRET": SECRET,
        "ANTHROPIC_BASE_URL": api.url,
        "LANEFLOW_CAPTURE_DIR": str(tmp_path / "captures"),
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("ANTHROPIC_API_KEY", "LANEFLOW_STATE_MACHINE_ARN", "LANEFLOW_EVENT_BUS", "LANEFLOW_ANTHROPIC_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    settings.cache_clear()
    install(None)
    with mock_aws(), moto_dynamodb_serialized():
        session = boto3.session.Session(region_name="us-east-1")
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)  # boto3.client(...) is this session's
        reads = SecretReads()
        session.events.register("before-call.secrets-manager.GetSecretValue", reads)
        init_store(URL)
        s3 = boto3.client("s3")
        for path in ws.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "laneflow-blobs", f"workspaces/{TENANT}/claude/{path.relative_to(ws).as_posix()}")
        yield reads
        install(None)
    settings.cache_clear()


def start(flow: str) -> str:
    body = {"workspace": "claude", "flow": flow, "input": {}}
    answer = handler("api")(api_event("start_run", body=json.dumps(body)), None)
    assert answer["statusCode"] == 201, answer["body"]
    run_id: str = json.loads(answer["body"])["id"]
    return run_id


@pytest.mark.slow
def test_only_a_step_reads_the_model_key_once_and_nothing_else_reads_it(cloud: SecretReads) -> None:
    reads = cloud
    boto3.client("secretsmanager").create_secret(Name=SECRET, SecretString=KEY)

    # Given services built from the environment, as a container's first call builds them
    svc = services()
    svc.drives = StartedDrives()
    assert reads.by == []

    # When the API starts a run that only parks, reconcile runs, and the run is driven to its
    # approval, approved through the API and driven to its end
    parked = start("ask")
    handler("reconcile")(json.loads((ROOT / "events" / "reconcile.json").read_text()), None)
    engine = local_engine(svc)
    assert engine.drive(TENANT, parked, tick_s=0.02).run.status == RunStatus.awaiting_approval
    path = f"/runs/{parked}/approval"
    answer = handler("api")(
        api_event("answer_approval", pathParameters={"run_id": parked}, path=path, body='{"approve": true}'), None
    )
    assert answer["statusCode"] == 200, answer["body"]
    assert engine.drive(TENANT, parked, tick_s=0.02).run.status == RunStatus.completed

    # Then nothing read the key: not the services, the API, reconcile, StartDrive, NextGroup,
    # ParkRun or EndRun (the API accepts a Claude run without reading it either)
    claude = start("fanout")
    assert reads.by == []

    # When a Claude fan-out of four steps runs
    run = engine.drive(TENANT, claude, tick_s=0.02).run

    # Then RunStep read the key once, and the imitation (which takes only that key) answered
    assert run.status == RunStatus.completed, run.error
    assert [s.status for s in run.steps] == [StepStatus.completed] * 4
    assert reads.by == ["run_step"]
    assert KEY not in json.dumps(run.public())


@pytest.mark.slow
def test_a_model_key_that_cannot_be_read_fails_the_claude_step_naming_the_secret(cloud: SecretReads) -> None:
    # Given no such secret: a step that needs the key fails, said once, not retried
    svc = services()
    svc.drives = StartedDrives()
    run = local_engine(svc).drive(TENANT, start("fanout"), tick_s=0.02).run
    assert run.status == RunStatus.failed
    lead = run.steps[0]
    assert lead.status == StepStatus.failed and lead.attempts == 1
    assert lead.error == f"the model's key could not be read from Secrets Manager secret {SECRET!r}: ResourceNotFoundException"
    assert all(s.status != StepStatus.running for s in run.steps)


def test_a_json_secret_gives_its_anthropic_api_key_field_and_an_empty_one_is_refused(cloud: SecretReads) -> None:
    client = boto3.client("secretsmanager")
    client.create_secret(Name="console-made", SecretString=json.dumps({"ANTHROPIC_API_KEY": KEY}))
    client.create_secret(Name="empty-json", SecretString=json.dumps({"other": "x"}))
    assert read_model_key("console-made") == KEY
    with pytest.raises(ModelNotConfigured, match="'empty-json' holds no model key"):
        read_model_key("empty-json")


def _policies_read_the_secret(policies: list[Any]) -> bool:
    text = json.dumps(policies)
    return "AWSSecretsManagerGetSecretValuePolicy" in text or "secretsmanager:GetSecretValue" in text


def test_only_the_functions_allowed_to_read_the_model_secret_are_given_its_name() -> None:
    template = Template.load(ROOT / "template.yaml")
    common = template.body["Globals"]["Function"].get("Environment", {}).get("Variables", {})
    assert "LANEFLOW_ANTHROPIC_SECRET" not in common
    given, allowed = set(), set()
    for logical_id, resource in template.resources.items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        props = resource["Properties"]
        env = {**common, **props.get("Environment", {}).get("Variables", {})}
        if "LANEFLOW_ANTHROPIC_SECRET" in env:
            given.add(logical_id)
            assert env["LANEFLOW_ANTHROPIC_SECRET"] == {"Ref": "AnthropicSecretName"}
        if _policies_read_the_secret(props.get("Policies", [])):
            allowed.add(logical_id)
    assert given == allowed == {"RunStepFunction"}
