"""The stack's alarms, read from template.yaml: every function's errors and throttles (a
function added without them fails here), both APIs' 5XX answers, the state machine's failed
and timed-out drives, and the prompt cache's trouble, on the metrics laneflow's Powertools
adapter really emits."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from helpers import ROOT

from laneflow.adapters.aws import powertools
from laneflow.adapters.engine.template import Template
from laneflow.domain.records import ModelCall, Tokens

TEMPLATE = Template.load(ROOT / "template.yaml")
NOTIFY = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


def _alarms(resources: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in resources.items() if v["Type"] == "AWS::CloudWatch::Alarm"}


def _watching(resources: dict[str, Any], namespace: str, metric: str, dimensions: list[dict[str, Any]]) -> list[str]:
    """The alarms on exactly this metric stream (namespace, name and every dimension)."""
    return [
        name
        for name, alarm in _alarms(resources).items()
        if alarm["Properties"].get("Namespace") == namespace
        and alarm["Properties"].get("MetricName") == metric
        and sorted(alarm["Properties"]["Dimensions"], key=lambda d: d["Name"]) == sorted(dimensions, key=lambda d: d["Name"])
    ]


def missing_function_alarms(resources: dict[str, Any]) -> list[str]:
    """'<function> <metric>' for each function of the template without an alarm on its Lambda
    Errors or Throttles."""
    functions = sorted(k for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function")
    return [
        f"{function} {metric}"
        for function in functions
        for metric in ("Errors", "Throttles")
        if not _watching(resources, "AWS/Lambda", metric, [{"Name": "FunctionName", "Value": {"Ref": function}}])
    ]


def test_every_function_of_the_template_has_an_errors_and_a_throttles_alarm() -> None:
    functions = [k for k, v in TEMPLATE.resources.items() if v["Type"] == "AWS::Serverless::Function"]
    assert len(functions) >= 11  # the drive's handlers, the API and reconcile
    assert missing_function_alarms(TEMPLATE.resources) == []


def test_a_function_added_without_alarms_is_reported_by_the_check_above() -> None:
    resources = copy.deepcopy(TEMPLATE.resources)
    resources["ExtraFunction"] = copy.deepcopy(resources["StartDriveFunction"])
    assert missing_function_alarms(resources) == ["ExtraFunction Errors", "ExtraFunction Throttles"]
    del resources["StartDriveThrottlesAlarm"]
    assert "StartDriveFunction Throttles" in missing_function_alarms(resources)


def test_every_alarm_notifies_the_topic_parameter_and_treats_no_data_as_fine() -> None:
    for name, alarm in _alarms(TEMPLATE.resources).items():
        props = alarm["Properties"]
        assert props["AlarmActions"] == NOTIFY and props["OKActions"] == NOTIFY, name
        assert props["TreatMissingData"] == "notBreaching", name  # an idle stack is not an incident
        assert props["AlarmName"]["Fn::Sub"].startswith("${AWS::StackName}-"), name  # two stacks never clash


def _rest_api_name(logical_id: str) -> Any:
    """The name API Gateway gives a SAM API's REST API, under which it publishes its metrics:
    its definition's title, which SAM sets to the stack's name when it generates the definition."""
    props = TEMPLATE.resources[logical_id]["Properties"]
    assert "Name" not in props  # the name is the title, never two names that could disagree
    body = props.get("DefinitionBody")
    return body["info"]["title"] if body else {"Ref": "AWS::StackName"}


@pytest.mark.parametrize("api", ["LaneflowApi", "PeopleApi"])
def test_each_api_has_a_5xx_alarm_on_its_own_name_and_stage(api: str) -> None:
    resource = TEMPLATE.resources[api]
    stage = resource["Properties"]["StageName"]
    dimensions = [{"Name": "ApiName", "Value": _rest_api_name(api)}, {"Name": "Stage", "Value": stage}]
    [alarm] = _watching(TEMPLATE.resources, "AWS/ApiGateway", "5XXError", dimensions)
    props = TEMPLATE.resources[alarm]["Properties"]
    assert (props["Statistic"], props["ComparisonOperator"], props["Threshold"]) == ("Sum", "GreaterThanOrEqualToThreshold", 1)
    # An alarm on an API the stack may not make exists only with it.
    assert TEMPLATE.resources[alarm].get("Condition") == resource.get("Condition")


def test_the_two_apis_publish_their_metrics_under_different_names() -> None:
    assert _rest_api_name("LaneflowApi") != _rest_api_name("PeopleApi")


@pytest.mark.parametrize("metric", ["ExecutionsFailed", "ExecutionsTimedOut"])
def test_drives_that_fail_or_time_out_raise_an_alarm(metric: str) -> None:
    dimensions = [{"Name": "StateMachineArn", "Value": {"Ref": "FlowStateMachine"}}]
    assert _watching(TEMPLATE.resources, "AWS/States", metric, dimensions), f"no alarm on {metric}"


def _emitted(monkeypatch: pytest.MonkeyPatch, calls: list[ModelCall], savings_usd: float) -> dict[str, Any]:
    """The EMF document the adapter writes for one step attempt, as it would in Lambda."""
    monkeypatch.setattr(powertools, "IN_LAMBDA", True)
    powertools.metrics.clear_metrics()
    try:
        powertools.step_metrics(cost_usd=0.01, duration_ms=900, calls=calls, gate_wait_ms=None, savings_usd=savings_usd)
        return cast(dict[str, Any], powertools.metrics.serialize_metric_set())
    finally:
        powertools.metrics.clear_metrics()


def test_the_cache_alarms_watch_the_metric_streams_the_adapter_emits(monkeypatch: pytest.MonkeyPatch) -> None:
    cold = ModelCall(id="call-1", tokens=Tokens(input=10, cache_write=4000))
    document = _emitted(monkeypatch, [cold], savings_usd=-0.004)
    [directive] = document["_aws"]["CloudWatchMetrics"]
    [[dimension]] = directive["Dimensions"]  # one dimension set, of one dimension
    dimensions = [{"Name": dimension, "Value": document[dimension]}]
    assert document["ColdPrefixesWritten"] == [1.0] and document["CacheSavingsUSD"] == [-0.004]

    [cold_alarm] = _watching(TEMPLATE.resources, directive["Namespace"], "ColdPrefixesWritten", dimensions)
    props = TEMPLATE.resources[cold_alarm]["Properties"]
    assert (props["Statistic"], props["Period"], props["ComparisonOperator"]) == ("Sum", 3600, "GreaterThanThreshold")
    assert props["Threshold"] == {"Ref": "ColdPrefixesAlarmThreshold"}
    assert int(TEMPLATE.body["Parameters"]["ColdPrefixesAlarmThreshold"]["Default"]) >= 1

    [savings_alarm] = _watching(TEMPLATE.resources, directive["Namespace"], "CacheSavingsUSD", dimensions)
    props = TEMPLATE.resources[savings_alarm]["Properties"]
    # Below zero over an hour: the cache's writes cost more than its reads saved.
    assert (props["Statistic"], props["Period"], props["ComparisonOperator"], props["Threshold"]) == (
        "Sum",
        3600,
        "LessThanThreshold",
        0,
    )


def test_a_step_whose_first_call_read_the_cache_adds_no_cold_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    warm = ModelCall(id="call-1", tokens=Tokens(input=10, cache_read=4000))
    document = _emitted(monkeypatch, [warm], savings_usd=0.01)
    assert document["ColdPrefixesWritten"] == [0.0] and document["CacheSavingsUSD"] == [0.01]


def test_the_readme_tells_what_to_do_for_every_alarm() -> None:
    rows = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    for name, alarm in _alarms(TEMPLATE.resources).items():
        suffix = alarm["Properties"]["AlarmName"]["Fn::Sub"].removeprefix("${AWS::StackName}")
        assert any(f"`STACK{suffix}`" in row for row in rows), f"{name} ({suffix}) has no row in the README's alarm table"
