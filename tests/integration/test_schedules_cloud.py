"""Schedules' cloud path under moto: the template's schedule group, the role Scheduler
assumes (it may invoke only FireSchedule, and send to only the schedules' dead-letter queue)
and the queue, made in moto from template.yaml's own properties; a schedule added through
the API handler is an EventBridge Scheduler schedule there (its expression, zone, target,
retry policy and dead-letter queue); pausing, resuming and removing it change that schedule;
and the fire function, invoked with the target's Input as Scheduler fills it (twice: Scheduler
delivers at least once), starts exactly one run, which the API lists under the schedule."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import FIXTURES, ROOT, moto_dynamodb_serialized
from moto import mock_aws

from laneflow.adapters.aws.s3 import S3Workspaces
from laneflow.adapters.aws.scheduler import RETRY, SCHEDULED_TIME, schedule_name
from laneflow.adapters.engine.template import Template
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.domain.schedules import Schedule
from laneflow.settings import Settings
from laneflow.wiring import for_store, install

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"
TENANT = "123456789012"
REGION = "us-east-1"
STACK = "laneflow"
RESOURCES = Template.load(ROOT / "template.yaml").resources
FIRE_ARN = f"arn:aws:lambda:{REGION}:{TENANT}:function:{STACK}-FireScheduleFunction"


def handler(name: str) -> Callable[[Any, Any], Any]:
    spec = importlib.util.spec_from_file_location(f"cloud_{name}", ROOT / "functions" / name / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answer: Callable[[Any, Any], Any] = module.handler
    return answer


class Deployed:
    """The template's intrinsic functions over what this test made in moto."""

    def __init__(self) -> None:
        self.refs: dict[str, str] = {
            "AWS::StackName": STACK,
            "AWS::AccountId": TENANT,
            "AWS::Region": REGION,
            "AWS::Partition": "aws",
        }
        self.attrs: dict[tuple[str, str], str] = {("FireScheduleFunction", "Arn"): FIRE_ARN}

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.value(v) for v in node]
        if not isinstance(node, dict):
            return node
        if set(node) == {"Ref"}:
            return self.refs[node["Ref"]]
        if set(node) == {"Fn::GetAtt"}:
            name, attr = node["Fn::GetAtt"]
            return self.attrs[(name, attr)]
        if set(node) == {"Fn::Sub"}:
            return re.sub(r"\$\{([^}]+)\}", lambda m: self._sub(m[1]), node["Fn::Sub"])
        return {k: self.value(v) for k, v in node.items()}

    def _sub(self, name: str) -> str:
        if "." in name:
            resource, attr = name.split(".", 1)
            return self.attrs[(resource, attr)]
        return self.refs[name]


class Drives:
    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append(run_id)
        return f"arn:aws:states:{REGION}:{TENANT}:execution:{STACK}-flow:{run_id}"


def deploy_schedule_resources(stack: Deployed) -> dict[str, str]:
    """The schedule group, the dead-letter queue and the role, as template.yaml declares them."""
    group = stack.value(RESOURCES["ScheduleGroup"]["Properties"]["Name"])
    boto3.client("scheduler", region_name=REGION).create_schedule_group(Name=group)
    stack.refs["ScheduleGroup"] = group
    queue_props = RESOURCES["ScheduleDeadLetterQueue"]["Properties"]
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(
        QueueName=f"{STACK}-ScheduleDeadLetterQueue",
        Attributes={"MessageRetentionPeriod": str(queue_props["MessageRetentionPeriod"])},
    )["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    stack.attrs[("ScheduleDeadLetterQueue", "Arn")] = queue_arn
    role_props = RESOURCES["ScheduleInvokeRole"]["Properties"]
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName=f"{STACK}-ScheduleInvokeRole",
        AssumeRolePolicyDocument=json.dumps(stack.value(role_props["AssumeRolePolicyDocument"])),
    )["Role"]
    for policy in role_props["Policies"]:
        iam.put_role_policy(
            RoleName=role["RoleName"],
            PolicyName=policy["PolicyName"],
            PolicyDocument=json.dumps(stack.value(policy["PolicyDocument"])),
        )
    stack.attrs[("ScheduleInvokeRole", "Arn")] = role["Arn"]
    return {"group": group, "queue": queue_arn, "role": role["Arn"], "role_name": role["RoleName"]}


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with mock_aws(), moto_dynamodb_serialized():
        init_store(URL)
        s3 = boto3.client("s3", region_name=REGION)
        workspace = FIXTURES / "ws_control"
        for path in workspace.rglob("*"):
            if path.is_file():
                s3.upload_file(
                    str(path), "laneflow-blobs", f"workspaces/{TENANT}/ws_control/{path.relative_to(workspace).as_posix()}"
                )
        stack = Deployed()
        made = deploy_schedule_resources(stack)
        # The API function's environment, as template.yaml gives it.
        env = {
            k: stack.value(v)
            for k, v in RESOURCES["ApiFunction"]["Properties"]["Environment"]["Variables"].items()
            if k.startswith("LANEFLOW_SCHEDULE")
        }
        settings = Settings.from_env({"LANEFLOW_STORE": URL, "LANEFLOW_TENANT": TENANT, **env})
        svc = for_store(open_store(URL), settings)
        assert svc.triggers is not None  # the wiring makes Scheduler's triggers from that environment
        svc.workspaces = S3Workspaces("laneflow-blobs")
        svc.drives = Drives()
        install(svc)
        try:
            yield {"svc": svc, **made, "env": env}
        finally:
            install(None)


def api_call(method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
    event = json.loads((ROOT / "events" / "api_start_run.json").read_text())
    event.update(
        httpMethod=method,
        path=path,
        resource=path,
        body=None if body is None else json.dumps(body),
        queryStringParameters=query,
        multiValueQueryStringParameters={k: [v] for k, v in query.items()} if query else None,
    )
    event["requestContext"] = {**event["requestContext"], "httpMethod": method, "path": path, "resourcePath": path}
    answer = handler("api")(event, None)
    return answer["statusCode"], json.loads(answer["body"])


def document(policy: Any) -> dict[str, Any]:
    """An IAM policy document as IAM answers it (boto3 gives it decoded; its type says it may be text)."""
    found: dict[str, Any] = json.loads(policy) if isinstance(policy, str) else dict(policy)
    return found


def test_the_template_makes_a_schedule_group_and_a_role_that_may_only_invoke_fire_schedule(cloud: dict[str, Any]) -> None:
    assert RESOURCES["ScheduleGroup"]["Type"] == "AWS::Scheduler::ScheduleGroup"
    group = boto3.client("scheduler", region_name=REGION).get_schedule_group(Name=cloud["group"])
    assert group["Name"] == f"{STACK}-schedules" and group["State"] == "ACTIVE"
    iam = boto3.client("iam", region_name=REGION)
    trust = document(iam.get_role(RoleName=cloud["role_name"])["Role"]["AssumeRolePolicyDocument"])
    [assume] = trust["Statement"]
    assert assume["Principal"] == {"Service": "scheduler.amazonaws.com"} and assume["Action"] == "sts:AssumeRole"
    assert assume["Condition"] == {"StringEquals": {"aws:SourceAccount": TENANT}}
    [name] = iam.list_role_policies(RoleName=cloud["role_name"])["PolicyNames"]
    statements = document(iam.get_role_policy(RoleName=cloud["role_name"], PolicyName=name)["PolicyDocument"])["Statement"]
    assert sorted((s["Action"], s["Resource"]) for s in statements) == [
        ("lambda:InvokeFunction", FIRE_ARN),
        ("sqs:SendMessage", cloud["queue"]),
    ]
    assert all(s["Effect"] == "Allow" for s in statements)
    assert iam.list_attached_role_policies(RoleName=cloud["role_name"])["AttachedPolicies"] == []
    # The alarm watches that queue.
    alarm = RESOURCES["SchedulesUndeliveredAlarm"]["Properties"]
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["ScheduleDeadLetterQueue", "QueueName"]}}]
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible" and alarm["Threshold"] == 1


def test_a_schedule_added_through_the_api_is_a_scheduler_schedule_that_fires_one_run_per_firing(cloud: dict[str, Any]) -> None:
    svc = cloud["svc"]
    body = {"workspace": "ws_control", "flow": "approval", "expression": "cron(0 7 ? * MON-FRI *)", "timezone": "Europe/Berlin"}
    status, made = api_call("POST", "/schedules", body)
    assert status == 201, made
    schedule = Schedule.model_validate({**made, "tenant": TENANT})
    scheduler = boto3.client("scheduler", region_name=REGION)
    there = scheduler.get_schedule(Name=schedule_name(schedule), GroupName=cloud["group"])
    assert there["ScheduleExpression"] == "cron(0 7 ? * MON-FRI *)" and there["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert there["State"] == "ENABLED" and there["FlexibleTimeWindow"] == {"Mode": "OFF"}
    target = there["Target"]
    assert target["Arn"] == FIRE_ARN and target["RoleArn"] == cloud["role"]
    assert target["RetryPolicy"] == RETRY and target["DeadLetterConfig"] == {"Arn": cloud["queue"]}
    sent = json.loads(target["Input"])
    assert sent == {"tenant": TENANT, "schedule_id": made["id"], "scheduled_at": SCHEDULED_TIME}

    # Scheduler fires it: the Input with its scheduled time, delivered twice.
    delivered = json.loads(target["Input"].replace(SCHEDULED_TIME, "2026-12-24T06:00:00Z"))
    fire = handler("fire_schedule")
    first, second = fire(delivered, None), fire(delivered, None)
    assert first["outcome"] == second["outcome"] == "started" and first["run_id"] == second["run_id"]
    assert (first["replayed"], second["replayed"]) == (False, True)
    assert svc.drives.started == [first["run_id"]]  # one drive: exactly one run
    assert [r.id for r in svc.store.list_runs(TENANT)] == [first["run_id"]]
    status, page = api_call("GET", "/runs", query={"schedule": made["id"]})
    assert status == 200 and [(r["id"], r["schedule_id"], r["scheduled_at"]) for r in page["runs"]] == [
        (first["run_id"], made["id"], "2026-12-24T06:00:00Z")
    ]

    # Pausing and resuming change the Scheduler schedule itself; removing deletes it.
    assert api_call("POST", f"/schedules/{made['id']}/pause")[0] == 200
    assert scheduler.get_schedule(Name=schedule_name(schedule), GroupName=cloud["group"])["State"] == "DISABLED"
    assert api_call("POST", f"/schedules/{made['id']}/resume")[0] == 200
    resumed = scheduler.get_schedule(Name=schedule_name(schedule), GroupName=cloud["group"])
    assert resumed["State"] == "ENABLED" and resumed["Target"]["Input"] == target["Input"]
    assert api_call("DELETE", f"/schedules/{made['id']}")[0] == 200
    with pytest.raises(scheduler.exceptions.ResourceNotFoundException):
        scheduler.get_schedule(Name=schedule_name(schedule), GroupName=cloud["group"])
    assert [r.id for r in svc.store.list_runs(TENANT)] == [first["run_id"]]  # its run stays


def test_a_rate_schedule_starts_one_period_after_it_was_made_and_a_bad_one_makes_nothing(cloud: dict[str, Any]) -> None:
    status, made = api_call(
        "POST", "/schedules", {"workspace": "ws_control", "flow": "approval", "expression": "rate(15 minutes)"}
    )
    assert status == 201, made
    schedule = Schedule.model_validate({**made, "tenant": TENANT})
    there = boto3.client("scheduler", region_name=REGION).get_schedule(Name=schedule_name(schedule), GroupName=cloud["group"])
    assert there["ScheduleExpression"] == "rate(15 minutes)"
    assert (there["StartDate"] - schedule.anchor.replace(second=0, microsecond=0)).total_seconds() == 900
    status, refused = api_call(
        "POST", "/schedules", {"workspace": "ws_control", "flow": "nope", "expression": "rate(15 minutes)"}
    )
    assert status == 400 and refused["problems"][0]["field"] == "flow"
    listed = boto3.client("scheduler", region_name=REGION).list_schedules(GroupName=cloud["group"])["Schedules"]
    assert [s["Name"] for s in listed] == [schedule_name(schedule)]


def test_a_firing_of_a_schedule_removed_meanwhile_is_answered_gone_and_starts_nothing(cloud: dict[str, Any]) -> None:
    event = {"tenant": TENANT, "schedule_id": "sch-0000000000000000", "scheduled_at": "2026-12-24T06:00:00Z"}
    answer = handler("fire_schedule")(event, None)
    assert answer["outcome"] == "gone" and cloud["svc"].drives.started == []
