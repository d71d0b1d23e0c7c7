"""The sandbox's cloud path under moto: the deployed definition (its substitutions pointed at
a cluster, task definition, subnet and security group made in moto) reaches its sandbox
state, which calls moto's ECS RunTask with the task token and the step request as container
overrides; the test then plays the Fargate task, running the sandbox worker's entrypoint
in-process with the environment ECS recorded and boto3's Step Functions callbacks, and the
token's round trip completes the execution. A stop sends StopTask; reconcile treats a
STOPPED task's attempt as interrupted."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import moto_dynamodb_serialized
from moto import mock_aws

from laneflow.adapters.aws.ecs import EcsTasks, task_alive
from laneflow.adapters.engine.local import LocalEngine, overrides_environment
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.adapters.workers import Liveness
from laneflow.domain.records import AttemptStatus, Run, RunStatus, StepStatus, utcnow
from laneflow.domain.workers import FargateTask
from laneflow.entrypoints import sandbox_worker
from laneflow.settings import Settings
from laneflow.usecases.reconcile import INTERRUPTED, Reconciler
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import bound, for_store
from laneflow_dev.moto_support import ecs_in_step_functions

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"
TENANT = "123456789012"
REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), moto_dynamodb_serialized(), ecs_in_step_functions():
        init_store(URL)
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="sandbox", Description="sandbox", VpcId=vpc)["GroupId"]
        ecs = boto3.client("ecs", region_name=REGION)
        cluster = ecs.create_cluster(clusterName="laneflow-sandbox")["cluster"]["clusterArn"]
        task_def = ecs.register_task_definition(
            family="laneflow-sandbox",
            requiresCompatibilities=["FARGATE"],
            networkMode="awsvpc",
            cpu="512",
            memory="1024",
            containerDefinitions=[
                {
                    "name": "step",
                    "image": "laneflow-sandbox",
                    "essential": True,
                    "cpu": 512,
                    "memory": 1024,
                    "command": ["python", "-m", "laneflow.entrypoints.sandbox_worker"],
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]
        svc = for_store(open_store(URL), Settings(store_url=URL, tenant=TENANT, capture_dir=str(tmp_path / "captures")))
        yield {
            "svc": svc,
            "ecs": ecs,
            "cluster": cluster,
            "subs": {
                "SandboxClusterArn": cluster,
                "SandboxTaskDefinitionArn": task_def,
                "SandboxSubnets": subnet,
                "SandboxSecurityGroups": group,
                "SandboxAssignPublicIp": "ENABLED",
            },
        }


def workspace(tmp_path: Path, stub: str) -> Path:
    ws = tmp_path / "ws-cloud-sandbox"
    (ws / "agents" / "builder").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "agents" / "builder" / "agent.md").write_text(f'---\nsandbox: true\nstub: "{stub}"\n---\nYou build.\n')
    (ws / "flows" / "build.yaml").write_text("steps:\n  - agent: builder\n    retries: 0\n    instruction: Build.\n")
    return ws


def start(aws: dict[str, Any], ws: Path) -> tuple[Run, Any, threading.Thread, dict[str, Any]]:
    svc = aws["svc"]
    run = create_run(svc, ws, "build", {}, tenant=TENANT)
    engine = LocalEngine(svc, bind=bound, local_sandboxes=False, substitutions=aws["subs"])
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", engine.drive(run.tenant, run.id, tick_s=0.02)), daemon=True)
    thread.start()
    return run, engine, thread, out


def the_task(aws: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        arns = aws["ecs"].list_tasks(cluster=aws["cluster"])["taskArns"]
        if arns:
            answer: dict[str, Any] = aws["ecs"].describe_tasks(cluster=aws["cluster"], tasks=arns)["tasks"][0]
            return answer
        time.sleep(0.05)
    raise AssertionError("the sandbox state started no task")


def fargate_environment(task: dict[str, Any]) -> dict[str, str]:
    """What the container would see: the task definition's command aside, ECS's recorded
    overrides over this process's settings (the store the task definition names)."""
    env = dict(os.environ)
    env.update(overrides_environment(task))
    env.update(LANEFLOW_STORE=URL, LANEFLOW_TENANT=TENANT, LANEFLOW_WORKER_TASK_ARN=task["taskArn"], LANEFLOW_HEARTBEAT_S="0.2")
    return env


def test_the_sandbox_state_starts_a_fargate_task_whose_worker_completes_the_token(aws: dict[str, Any], tmp_path: Path) -> None:
    ws = workspace(tmp_path, "built in the cloud")
    run, engine, thread, out = start(aws, ws)
    task = the_task(aws)
    assert task["launchType"] == "FARGATE" and task["taskDefinitionArn"] == aws["subs"]["SandboxTaskDefinitionArn"]
    env = overrides_environment(task)
    assert env["LANEFLOW_TASK_TOKEN"] and '"index":0' in env["LANEFLOW_STEP_REQUEST"].replace(" ", "")
    # The state's name and its task's memory: a turn one size up (its Catch's Again) is another operation.
    assert env["LANEFLOW_OP_STATE"] == "SandboxStarter@4096"
    # The test is the Fargate task: the worker runs in-process with what ECS recorded.
    assert sandbox_worker.run(fargate_environment(task)) == 0
    thread.join(60)
    result = out["result"]
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    stored = aws["svc"].store.get_run(run.tenant, run.id)
    assert stored.status == RunStatus.completed and stored.steps[0].result == "built in the cloud"
    (attempt,) = aws["svc"].store.list_attempts(run.tenant, run.id)
    assert attempt.worker == FargateTask(task=task["taskArn"])
    kinds = [e["type"] for e in engine.history(result.execution_arn)]
    assert "TaskSubmitted" in kinds and "TaskSucceeded" in kinds


def test_a_worker_that_fails_sends_task_failure_and_the_catch_ends_its_attempt(
    aws: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = workspace(tmp_path, "never")
    run, engine, thread, out = start(aws, ws)
    task = the_task(aws)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the worker broke before its claim")

    monkeypatch.setattr("laneflow.usecases.run_step.runner.run_step", broken)
    assert sandbox_worker.run(fargate_environment(task)) == 0
    thread.join(60)
    failed = [e for e in engine.history(out["result"].execution_arn) if e["type"] == "TaskFailed"]
    assert failed and failed[0]["taskFailedEventDetails"]["error"] == "RuntimeError"
    (step,) = aws["svc"].store.get_run(run.tenant, run.id).steps
    assert step.status == StepStatus.failed  # StepCrashed ended it, as for a Lambda that raised


def test_a_stop_sends_stop_task_and_the_worker_ends_its_attempt_stopped(aws: dict[str, Any], tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ttft_ms: 60000\\nnever")
    svc = aws["svc"]
    svc.tasks = EcsTasks(client=aws["ecs"])
    run, engine, thread, out = start(aws, ws)
    task = the_task(aws)
    worker = threading.Thread(target=sandbox_worker.run, args=(fargate_environment(task),), daemon=True)
    worker.start()
    deadline = time.monotonic() + 20
    while not svc.store.running_attempts(TENANT) and time.monotonic() < deadline:
        time.sleep(0.05)
    outcome = stop_run(svc, run.tenant, run.id)
    assert "1 sandbox task(s) told to stop" in outcome.message
    described = aws["ecs"].describe_tasks(cluster=aws["cluster"], tasks=[task["taskArn"]])["tasks"][0]
    assert described["desiredStatus"] == "STOPPED" and "was stopped" in described["stoppedReason"]
    worker.join(30)
    thread.join(60)
    assert not worker.is_alive() and not thread.is_alive()
    assert [a.status for a in svc.store.list_attempts(run.tenant, run.id)] == [AttemptStatus.stopped]
    assert svc.store.get_run(run.tenant, run.id).status.ended


def test_reconcile_marks_the_attempt_of_a_stopped_task_interrupted(aws: dict[str, Any], tmp_path: Path) -> None:
    svc, ecs = aws["svc"], aws["ecs"]
    ws = workspace(tmp_path, "never")
    run = create_run(svc, ws, "build", {}, tenant=TENANT)
    subs = aws["subs"]
    task = ecs.run_task(
        cluster=aws["cluster"],
        taskDefinition=subs["SandboxTaskDefinitionArn"],
        launchType="FARGATE",
        networkConfiguration={
            "awsvpcConfiguration": {"subnets": [subs["SandboxSubnets"]], "securityGroups": [subs["SandboxSecurityGroups"]]}
        },
    )["tasks"][0]["taskArn"]
    worker = FargateTask(task=task)
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 32, started_at=utcnow(), worker=worker)
    alive = task_alive(EcsTasks(client=ecs))
    assert alive(task) is True
    report = Reconciler(svc, Liveness(task_alive=alive)).run()
    assert [a.outcome for a in report.attempts] == ["continued"]  # a running task's attempt is left alone
    ecs.stop_task(cluster=aws["cluster"], task=task, reason="spot gone")
    assert alive(task) is False
    report = Reconciler(svc, Liveness(task_alive=alive)).run()
    assert [a.outcome for a in report.attempts] == ["interrupted"]
    (attempt,) = svc.store.list_attempts(run.tenant, run.id)
    assert attempt.status == AttemptStatus.interrupted and attempt.reason == INTERRUPTED


def test_a_script_with_a_secret_runs_in_the_fargate_worker_and_its_storage_file_reaches_s3(
    aws: dict[str, Any], tmp_path: Path
) -> None:
    # Given the tides example in the tenant's S3 prefix, its secret in Secrets Manager under
    # laneflow/<tenant>/TIDES_TOKEN, and a run started on it as the API starts one
    from helpers import EXAMPLES

    from laneflow.adapters.aws.s3 import S3Workspaces, local_path
    from laneflow.usecases.start_run import prepare_run

    svc = aws["svc"]
    s3 = boto3.client("s3", region_name=REGION)
    source = EXAMPLES / "tides"
    for path in source.rglob("*"):
        if path.is_file() and path.name != ".secrets.env":
            s3.upload_file(str(path), "laneflow-blobs", f"workspaces/{TENANT}/tides/{path.relative_to(source).as_posix()}")
    token = "cloud-tides-token-9f8e7d6c5b4a"
    boto3.client("secretsmanager", region_name=REGION).create_secret(Name=f"laneflow/{TENANT}/TIDES_TOKEN", SecretString=token)
    uri = S3Workspaces("laneflow-blobs").locate(TENANT, "tides")
    run = prepare_run(svc, local_path(uri), "tides", {"places": ["Brest"]}, tenant=TENANT)
    run.workspace_uri = uri
    svc.store.create_run(run)
    assert run.options["sandboxed"] == ["tide-keeper"]  # a script tool: sandboxed
    engine = LocalEngine(svc, bind=bound, local_sandboxes=False, substitutions=aws["subs"])
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", engine.drive(run.tenant, run.id, tick_s=0.02)), daemon=True)
    thread.start()
    # When the Fargate task runs the worker, reading secrets from Secrets Manager
    env = fargate_environment(the_task(aws))
    env.update(LANEFLOW_SECRET_SOURCE="secretsmanager", LANEFLOW_WORKSPACES="s3://laneflow-blobs/workspaces")
    assert sandbox_worker.run(env) == 0
    thread.join(60)
    # Then the step completed, its script got the secret, and what it filed is in S3
    assert out["result"].execution_status == "SUCCEEDED", (out["result"].error, out["result"].cause)
    stored = svc.store.get_run(run.tenant, run.id)
    assert stored.status == RunStatus.completed, stored.error
    table = (
        s3.get_object(Bucket="laneflow-blobs", Key=f"workspaces/{TENANT}/tides/storage/tides-brest.md")["Body"].read().decode()
    )
    assert "# Tides at Brest" in table
    counted = s3.get_object(Bucket="laneflow-blobs", Key=f"workspaces/{TENANT}/tides/state/tables-filed")["Body"].read()
    assert counted.strip() == b"1"
    [tool] = [e for e in stored.steps[0].events if e.type == "tool"]
    from laneflow.adapters.aws.s3 import S3Captures

    captured = S3Captures("laneflow-blobs", client=s3).get(tool.data["capture"])  # in the cloud, captures are in S3
    assert f"token of {len(token)} characters used" in captured["output"]
    items = boto3.client("dynamodb", region_name=REGION).scan(TableName="laneflow-runs")["Items"]
    assert token not in str(items)
