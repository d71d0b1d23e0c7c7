"""What the stack deploys to be operated, read from template.yaml itself: log groups with
retention for every function, the state machine and the API's access logs; alarms whose
metrics name the stack's own resources and notify a topic only when one is given; the
reconcile schedule's retries and dead-letter queue; no phantom "Stage" stage; the log level
from a parameter that the code lets win; and a build that needs no python3.12 on PATH."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from contract.store.backends import TENANT, big_text, claim, dynamodb_store, new_run
from helpers import ROOT

from laneflow.adapters.engine.template import Template
from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.domain.inbox import Note, NoteKind, QuestionStatus, new_note_id
from laneflow.domain.records import (
    AttemptStatus,
    Event,
    ModelCall,
    PromptLayer,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
    utcnow,
)

TEMPLATE = Template.load(ROOT / "template.yaml")
RESOURCES = TEMPLATE.resources
FUNCTIONS = {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::Serverless::Function"}
ALARMS = {k: v["Properties"] for k, v in RESOURCES.items() if v["Type"] == "AWS::CloudWatch::Alarm"}
RETENTION = {"Ref": "LogRetentionDays"}


def _log_groups() -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in RESOURCES.items() if v["Type"] == "AWS::Logs::LogGroup"}


def _target(value: Any) -> tuple[str, str] | None:
    """(resource logical id, attribute or "Ref") that a Ref or GetAtt names."""
    if isinstance(value, dict) and "Ref" in value:
        return value["Ref"], "Ref"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return value["Fn::GetAtt"][0], value["Fn::GetAtt"][1]
    return None


def _named(value: Any) -> tuple[str, str]:
    """What a Ref or GetAtt the template must have there names."""
    target = _target(value)
    assert target is not None, value
    return target


def _metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """Every metric an alarm reads: itself, or each MetricStat of its metric math."""
    if "MetricName" in alarm:
        return [{"Namespace": alarm["Namespace"], "MetricName": alarm["MetricName"], "Dimensions": alarm["Dimensions"]}]
    return [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]


def test_every_function_has_a_log_group_of_its_own_with_the_retention_parameter() -> None:
    groups = _log_groups()
    named = {props["LogGroupName"]["Fn::Sub"]: props for props in groups.values() if isinstance(props["LogGroupName"], dict)}
    assert FUNCTIONS
    for logical_id in FUNCTIONS:
        props = named.get(f"/aws/lambda/${{{logical_id}}}")
        assert props is not None, f"{logical_id} has no log group /aws/lambda/${{{logical_id}}}"
        assert props["RetentionInDays"] == RETENTION, logical_id
    default = TEMPLATE.body["Parameters"]["LogRetentionDays"]["Default"]
    assert 1 <= int(default) <= 90  # logs are kept a while, not forever


def test_the_state_machine_the_api_and_the_sandbox_log_to_groups_with_the_same_retention() -> None:
    groups = _log_groups()
    [destination] = RESOURCES["FlowStateMachine"]["Properties"]["Logging"]["Destinations"]
    state_machine_group, _ = _named(destination["CloudWatchLogsLogGroup"]["LogGroupArn"])
    access = RESOURCES["LaneflowApi"]["Properties"]["AccessLogSetting"]
    api_group, attribute = _named(access["DestinationArn"])
    assert attribute == "Arn"
    for logical_id in (state_machine_group, api_group, "SandboxLogGroup"):
        assert groups[logical_id]["RetentionInDays"] == RETENTION, logical_id
    assert all(props["RetentionInDays"] == RETENTION for props in groups.values())


def test_the_api_stage_writes_one_json_line_per_request_without_bodies_or_headers() -> None:
    api = RESOURCES["LaneflowApi"]
    line = api["Properties"]["AccessLogSetting"]["Format"]
    fields = json.loads(line)  # the format itself is one JSON object of $context variables
    assert fields["requestId"] == "$context.requestId" and fields["status"] == "$context.status"
    assert {"ip", "caller", "httpMethod", "resourcePath", "responseLatency", "error"} <= set(fields)
    assert not re.search(r"\$(input|context\.authorizer|method\.request)", line)  # no body, no token, no header
    # API Gateway writes access logs through the account's CloudWatch role, set before the API.
    assert api["DependsOn"] == "ApiGatewayAccount"
    role, _ = _named(RESOURCES["ApiGatewayAccount"]["Properties"]["CloudWatchRoleArn"])
    assert RESOURCES[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "apigateway.amazonaws.com"
    }


def test_sam_makes_no_phantom_stage_because_globals_set_the_openapi_version() -> None:
    assert TEMPLATE.body["Globals"]["Api"]["OpenApiVersion"] == "3.0.1"
    assert RESOURCES["LaneflowApi"]["Properties"]["StageName"] == "v1"


# What each required alarm watches: (namespace, metric, dimension, resource type, attribute).
REQUIRED = {
    "failed drives": (
        "AWS/States",
        "ExecutionsFailed",
        "StateMachineArn",
        "AWS::Serverless::StateMachine",
        "Ref",
        "FlowStateMachine",
    ),
    "reconcile errors": ("AWS/Lambda", "Errors", "FunctionName", "AWS::Serverless::Function", "Ref", "ReconcileFunction"),
    "step runner throttles": ("AWS/Lambda", "Throttles", "FunctionName", "AWS::Serverless::Function", "Ref", "RunStepFunction"),
    "table throttles": ("AWS/DynamoDB", "ThrottledRequests", "TableName", "AWS::DynamoDB::Table", "Ref", "RunsTable"),
    "undelivered reconciles": (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        "QueueName",
        "AWS::SQS::Queue",
        "QueueName",
        "ReconcileDeadLetterQueue",
    ),
}


@pytest.mark.parametrize("what", sorted(REQUIRED))
def test_each_alarm_watches_the_metric_of_the_real_resource(what: Any) -> None:
    namespace, metric, dimension, resource_type, attribute, resource = REQUIRED[what]
    watching = [
        name
        for name, alarm in ALARMS.items()
        if any(
            m["Namespace"] == namespace
            and m["MetricName"] == metric
            and any(d["Name"] == dimension and _target(d["Value"]) == (resource, attribute) for d in m["Dimensions"])
            for m in _metrics(alarm)
        )
    ]
    assert watching, f"no alarm on {namespace} {metric} of {resource}"
    assert RESOURCES[resource]["Type"] == resource_type
    for name in watching:
        alarm = ALARMS[name]
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["Threshold"] == 1, name
        assert alarm["TreatMissingData"] == "notBreaching", name  # no traffic is not an incident


def test_every_alarm_dimension_names_a_resource_of_this_stack() -> None:
    for name, alarm in ALARMS.items():
        for metric in _metrics(alarm):
            for dimension in metric["Dimensions"]:
                # Names, not references: a DynamoDB operation, an API's name and stage, the
                # service of laneflow's own metrics (tests/unit/test_template_alarms.py checks them).
                if dimension["Name"] in ("Operation", "ApiName", "Stage", "service"):
                    continue
                target = _target(dimension["Value"])
                assert target and target[0] in RESOURCES, f"{name}: {dimension}"


def test_the_table_throttle_alarm_sums_every_operation_the_dynamodb_store_calls(tmp_path: Path) -> None:
    alarm = ALARMS["TableThrottlesAlarm"]
    [watched] = [q for q in alarm["Metrics"] if q.get("ReturnData")]
    assert watched["Expression"] == "SUM(METRICS())"
    operations = {d["Value"] for m in _metrics(alarm) for d in m["Dimensions"] if d["Name"] == "Operation"}
    # What the store really sends: a run's traffic on a DynamoDB store under moto, every
    # operation its client sends recorded as botocore is about to make the call
    sent: set[str] = set()
    with dynamodb_store(tmp_path, reachable_from_children=False) as store:
        cast(DynamoStore, store)._db.meta.events.register("before-call.dynamodb", lambda model, **_: sent.add(model.name))
        dynamodb_workload(store)
    sent -= {"CreateTable", "DescribeTable", "UpdateTimeToLive"}  # provisioning, not a run's traffic
    assert {"GetItem", "Query", "Scan", "TransactWriteItems", "BatchWriteItem"} <= sent, f"too little sent: {sorted(sent)}"
    assert sent <= operations, f"not watched: {sorted(sent - operations)}"


def dynamodb_workload(store: Any) -> None:
    """A run's traffic on `store`: runs created, read and listed; steps claimed, heard from
    and ended; the journal; a gate waited on and opened; handoffs; notes and questions."""
    run = new_run(store, steps=3)
    store.get_run(TENANT, run.id)
    store.list_runs(TENANT)
    store.active_runs(TENANT)
    store.get_run_input(TENANT, run.id)
    store.get_steps(TENANT, run.id, group=0)
    store.get_group_outline(TENANT, run.id)
    store.update_run(TENANT, run.id, RunChanges(status=RunStatus.running))
    store.add_run_cost(TENANT, run.id, 0.5)
    _, ref = claim(store, run, 0, op_id="exec-1:RunStep:0:0")
    store.heartbeat(ref, utcnow())
    store.add_event(TENANT, run.id, 0, Event(text="a line"), attempt=ref)
    store.put_call(ref, ModelCall(id="call-1"))
    store.set_prompt_layers(ref, [PromptLayer(name="agents.md", chars=10, sha256="ab12")])
    note = Note(
        id=new_note_id(NoteKind.message),
        run_id=run.id,
        kind=NoteKind.message,
        to_index=0,
        from_index=1,
        from_agent="scout",
        attempt=1,
        text="hi",
    )
    store.post_note(TENANT, run.id, note)
    store.get_inbox(TENANT, run.id, 0)
    store.get_note(TENANT, run.id, note.id)
    store.observe(ref, [note.id])
    store.get_observed(TENANT, run.id, 0)
    for answered in (True, False):
        ask = Note(
            id=new_note_id(NoteKind.question),
            run_id=run.id,
            kind=NoteKind.question,
            to_index=0,
            from_index=0,
            from_agent="scout",
            attempt=1,
            text="which?",
            status=QuestionStatus.open,
        )
        store.post_note(TENANT, run.id, ask)
        store.list_open_questions(TENANT)
        if answered:
            store.answer_question(TENANT, run.id, ask.id, "this one", at=utcnow())
        else:
            store.close_question(TENANT, run.id, ask.id)
    store.running_attempts(TENANT)
    store.put_handoff(TENANT, run.id, "lead", big_text())  # over the blob threshold: S3 and a pointer
    store.get_handoff(TENANT, run.id, "lead")
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed), calls=[ModelCall(id="call-2")])
    store.list_attempts(TENANT, run.id)
    store.get_attempt(TENANT, run.id, 0, 1)
    store.get_step(TENANT, run.id, 0, detail=True)
    store.get_step_status(TENANT, run.id, 0)
    store.journal_begin(TENANT, run.id, "exec-1:RunStep:1:0", 1)
    store.journal_pending(TENANT)
    store.journal_settle(TENANT, run.id, "exec-1:RunStep:1:0")
    store.gate_wait(TENANT, run.id, "g0", "tok-1", index=1)
    store.gate_wait(TENANT, run.id, "g0", "tok-2", index=2, until_lead_ends=True)
    store.gate_open(TENANT, run.id, "g0", note="the lead's note")
    store.gate_open(TENANT, run.id, "g0", lead_ended=True)
    store.gate_wait(TENANT, run.id, "g0", "tok-3", index=1)
    store.update_step(TENANT, run.id, 2, StepChanges(status=StepStatus.skipped, skip_reason="not needed"))
    store.add_steps(TENANT, run.id, [Step(index=3, group=2, agent="researcher")])
    store.request_stop(TENANT, run.id)
    store.update_run(TENANT, run.id, RunChanges(status=RunStatus.completed))
    store.get_run(TENANT, run.id, detail=True)
    # What a reconcile reads across tenants, and a fan-out over one transaction's 100 items
    store.active_runs()
    store.running_attempts()
    store.journal_pending()
    store.list_open_questions()
    new_run(store, steps=150)


def test_alarms_notify_the_topic_parameter_only_when_one_is_given() -> None:
    assert TEMPLATE.body["Parameters"]["AlarmTopicArn"]["Default"] == ""
    assert TEMPLATE.body["Conditions"]["HasAlarmTopic"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}
    notify = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    assert len(ALARMS) >= len(REQUIRED)
    for name, alarm in ALARMS.items():
        assert alarm["AlarmActions"] == notify and alarm["OKActions"] == notify, name


def test_the_reconcile_schedule_retries_and_keeps_what_it_could_not_deliver() -> None:
    [(event_id, event)] = RESOURCES["ReconcileFunction"]["Properties"]["Events"].items()
    assert event["Type"] == "Schedule"
    props = event["Properties"]
    assert props["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    assert 60 <= props["RetryPolicy"]["MaximumEventAgeInSeconds"] <= 300  # not older than the next reconcile
    queue, attribute = _named(props["DeadLetterConfig"]["Arn"])
    assert (RESOURCES[queue]["Type"], attribute) == ("AWS::SQS::Queue", "Arn")
    # EventBridge may write to the queue only for this rule (SAM names it function + event).
    [policy] = [
        r["Properties"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::SQS::QueuePolicy" and {"Ref": queue} in r["Properties"]["Queues"]
    ]
    [statement] = policy["PolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "events.amazonaws.com"} and statement["Action"] == "sqs:SendMessage"
    assert _target(statement["Resource"]) == (queue, "Arn")
    assert _target(statement["Condition"]["ArnEquals"]["aws:SourceArn"]) == (f"ReconcileFunction{event_id}", "Arn")


def test_the_log_level_is_a_parameter_given_to_every_function() -> None:
    env = TEMPLATE.body["Globals"]["Function"]["Environment"]["Variables"]
    assert env["POWERTOOLS_LOG_LEVEL"] == {"Ref": "LogLevel"} and "LOG_LEVEL" not in env
    assert TEMPLATE.body["Parameters"]["LogLevel"]["Default"] == "INFO"
    for logical_id, resource in FUNCTIONS.items():
        assert "POWERTOOLS_LOG_LEVEL" not in resource["Properties"].get("Environment", {}).get("Variables", {}), logical_id


def _logger_level(env: dict[str, str]) -> str:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("POWERTOOLS_LOG_LEVEL", "LOG_LEVEL", "AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_LOG_LEVEL")
    }
    code = "import logging; from laneflow.adapters.aws.powertools import logger; print(logging.getLevelName(logger.log_level))"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


@pytest.mark.slow
def test_powertools_log_level_from_the_environment_wins_in_lambda_and_locally() -> None:
    in_lambda = {"AWS_LAMBDA_FUNCTION_NAME": "RunStepFunction", "POWERTOOLS_TRACE_DISABLED": "1"}
    assert _logger_level({**in_lambda, "POWERTOOLS_LOG_LEVEL": "DEBUG"}) == "DEBUG"
    assert _logger_level({**in_lambda, "POWERTOOLS_LOG_LEVEL": "error"}) == "ERROR"
    assert _logger_level(in_lambda) == "INFO"
    assert _logger_level({"POWERTOOLS_LOG_LEVEL": "INFO"}) == "INFO"
    assert _logger_level({}) == "WARNING"  # a person's terminal: warnings only, unless asked


def test_sam_builds_the_layer_and_every_handler_with_make_so_python312_need_not_be_on_path(tmp_path: Path) -> None:
    runtime = TEMPLATE.body["Globals"]["Function"]["Runtime"]
    [arch] = TEMPLATE.body["Globals"]["Function"]["Architectures"]
    assert (runtime, arch) == ("python3.12", "arm64")
    layer = RESOURCES["LaneflowLayer"]
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    makefile = ROOT / layer["Properties"]["ContentUri"] / "Makefile"
    plan = subprocess.run(
        ["make", "-n", "-f", str(makefile), "build-LaneflowLayer", f"ARTIFACTS_DIR={tmp_path / 'layer'}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--platform manylinux2014_aarch64" in plan and "--python-version 3.12" in plan and "--only-binary=:all:" in plan
    assert f'--target "{tmp_path / "layer"}/python"' in plan  # a Python layer's modules go under python/
    for logical_id, resource in FUNCTIONS.items():
        assert resource["Metadata"]["BuildMethod"] == "makefile", logical_id
        source = ROOT / resource["Properties"]["CodeUri"]
        out = tmp_path / logical_id
        out.mkdir()
        # As sam build runs it: in a scratch copy, with the function's target and ARTIFACTS_DIR.
        scratch = tmp_path / f"{logical_id}-scratch"
        scratch.mkdir()
        subprocess.run(
            ["make", "-f", str(source / "Makefile"), f"build-{logical_id}", f"ARTIFACTS_DIR={out}"],
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert (out / "app.py").read_bytes() == (source / "app.py").read_bytes(), logical_id


@pytest.mark.parametrize("function", ["NextDriveFunction", "EndRunFunction"])
def test_the_functions_that_start_drives_from_inside_the_machine_name_it_by_its_fixed_name(function: str) -> None:
    """NextDrive (continue-as-new) and EndRun (a chained flow's drive) start executions of the
    state machine that names them: they get its ARN built from its fixed name, never a !Ref of
    it (a cycle), and may call StartExecution on exactly that ARN."""
    machine = RESOURCES["FlowStateMachine"]["Properties"]
    name = machine.get("Name")
    assert name == {"Fn::Sub": "${AWS::StackName}-flow"}
    props = FUNCTIONS[function]["Properties"]
    arn = props["Environment"]["Variables"]["LANEFLOW_STATE_MACHINE_ARN"]
    assert isinstance(arn, dict) and arn.get("Fn::Sub", "").endswith(":stateMachine:${AWS::StackName}-flow")
    statements = [s for p in props["Policies"] if isinstance(p, dict) for s in p.get("Statement", [])]
    starts = [s for s in statements if s.get("Action") == "states:StartExecution"]
    assert starts and all(s["Resource"] == arn for s in starts)


def test_the_sandbox_task_runs_unprivileged_on_a_read_only_root_with_one_scratch_volume() -> None:
    task = RESOURCES["SandboxTaskDefinition"]["Properties"]
    [step] = task["ContainerDefinitions"]
    assert step["User"] == "10001:10001" and step["ReadonlyRootFilesystem"] is True and step["Privileged"] is False
    assert step["LinuxParameters"]["Capabilities"]["Drop"] == ["ALL"] and "Add" not in step["LinuxParameters"]["Capabilities"]
    [volume] = task["Volumes"]
    assert "Host" not in volume and "EFSVolumeConfiguration" not in volume  # the task's own ephemeral storage
    [mount] = step["MountPoints"]
    assert mount == {"SourceVolume": volume["Name"], "ContainerPath": "/tmp", "ReadOnly": False}
    env = {e["Name"]: e["Value"] for e in step["Environment"]}
    assert env["HOME"] == env["TMPDIR"] == "/tmp"  # the only writable place


def test_the_sandbox_image_is_the_task_definitions_user_and_has_no_set_uid_program() -> None:
    dockerfile = (ROOT / "docker" / "sandbox" / "Dockerfile").read_text()
    [step] = RESOURCES["SandboxTaskDefinition"]["Properties"]["ContainerDefinitions"]
    users = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert users == [step["User"]]
    uid = re.search(r"--uid (\d+)", dockerfile)
    assert uid is not None and uid.group(1) == step["User"].split(":")[0]
    assert "-perm /6000 -exec chmod a-s" in dockerfile
