"""The state machine that deploys is the one the engine runs: the template wires every
substitution to a function whose handler exists, and the interpreter loads the definition."""

from __future__ import annotations

import functools
import importlib.util
import json
import operator
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from laneflow.adapters.engine.template import Template
from laneflow.domain import messages as contracts
from laneflow.domain.schedules import FireScheduleRequest

TEMPLATE = Template.load(ROOT / "template.yaml")
EVENT_MODELS = {
    "start_drive": contracts.StartDriveRequest,
    "next_group": contracts.NextGroupRequest,
    "run_step": contracts.RunStepRequest,
    "step_crashed": contracts.StepCrashedRequest,
    "wait_for_lead": contracts.WaitForLeadRequest,
    "settle_group": contracts.SettleGroupRequest,
    "end_run": contracts.EndRunRequest,
    "park_run": contracts.ParkRequest,
    "next_drive": contracts.NextDriveRequest,
    "fire_schedule": FireScheduleRequest,  # EventBridge Scheduler's target Input, not the state machine's
}


_STRICT: dict[type[BaseModel], type[BaseModel]] = {}


def strict(model: type[BaseModel]) -> type[BaseModel]:
    """A copy of a handler's model, and of every model it nests, that refuses unknown fields.

    The handlers' models ignore what they do not know (so the definition can add a field
    before a deployed handler reads it), which would let a misspelled field in a sample
    event pass unnoticed."""
    if model not in _STRICT:
        base = type(f"Strict{model.__name__}", (model,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__})
        fields = {name: (_strict_type(info.annotation), info) for name, info in model.model_fields.items()}
        _STRICT[model] = create_model(base.__name__, __base__=base, __module__=__name__, **fields)  # type: ignore[call-overload]
    return _STRICT[model]


def _strict_type(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return strict(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is None or origin is typing.Literal or not args:
        return annotation
    args = tuple(_strict_type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, args)
    return origin[args if len(args) > 1 else args[0]]


def _states(node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, state in node["States"].items():
        yield name, state
        for key in ("ItemProcessor", "Iterator"):
            if key in state:
                yield from _states(state[key])
        for branch in state.get("Branches", []):
            yield from _states(branch)


def test_every_substitution_in_the_definition_is_wired_to_a_template_function_or_the_sandbox() -> None:
    path, subs = TEMPLATE.state_machine()
    used = set(re.findall(r"\$\{(\w+)\}", path.read_text()))
    assert used == set(subs), "definition and DefinitionSubstitutions disagree"
    functions = TEMPLATE.functions()
    sandbox = {"SandboxCluster", "SandboxTaskDefinition", "SandboxSubnets", "SandboxSecurityGroups", "SandboxAssignPublicIp"}
    for name, value in subs.items():
        if name.endswith("FunctionArn"):
            assert value["Fn::GetAtt"][0] in functions, name
            continue
        value = value.get("Fn::If", [None, None, value])[2]  # its else: what the parameters' defaults choose
        refs = value.get("Fn::Join", [None, value])[1]
        refs = refs if isinstance(refs, list) else [refs]
        target = refs[0].get("Ref") or refs[0].get("Fn::GetAtt", [None])[0]
        assert target in sandbox and (target in TEMPLATE.resources or target in TEMPLATE.body["Parameters"]), name


def test_a_sandboxed_lane_and_a_sandboxed_rescue_each_cost_one_choice_and_reach_ecs_with_a_heartbeat() -> None:
    definition = json.loads(TEMPLATE.definition(lambda lid: f"arn:aws:lambda:us-east-1:123456789012:function:{lid}"))
    states = dict(_states(definition))
    assert states["LaneSandboxed"]["Choices"][0] == {
        "Variable": "$.lane.sandboxed",
        "BooleanEquals": True,
        "Next": "RunSandboxLane",
    }
    assert states["RescueSandboxed"]["Choices"][0]["Variable"] == "$.step.sandboxed"
    for name in ("SandboxStarter", "SandboxSibling", "SandboxRescue"):
        state = states[name]
        assert state["Resource"] == "arn:aws:states:::ecs:runTask.waitForTaskToken"
        assert 0 < state["HeartbeatSeconds"] < state["TimeoutSeconds"]
        env = {e["Name"]: e for e in state["Parameters"]["Overrides"]["ContainerOverrides"][0]["Environment"]}
        assert env["LANEFLOW_TASK_TOKEN"]["Value.$"] == "$$.Task.Token"
        assert env["LANEFLOW_STEP_REQUEST"]["Value.$"] == "States.JsonToString($)"
        assert state["Catch"][0]["ErrorEquals"] == ["States.ALL"]  # a crash ends the attempt like the Lambda path
        crashed = states[state["Catch"][0]["Next"]]
        assert "StepCrashed" in crashed["Parameters"]["FunctionName"]
        # Stopped for memory or evicted below `large`: the answer is the next size's task, and
        # its Choice starts the same state again, under another operation id (its memory).
        where = "$.step.task" if name == "SandboxRescue" else "$.task"
        assert crashed["Parameters"]["Payload"]["size_up"] is True and crashed["ResultPath"] == where
        assert set(crashed["ResultSelector"]) == {"cpu.$", "memory.$", "again.$"}
        again = states[crashed["Next"]]
        assert again["Choices"] == [{"Variable": f"{where}.again", "BooleanEquals": True, "Next": name}]
        assert states[again["Default"]]["Type"] == "Succeed"
        assert env["LANEFLOW_OP_STATE"]["Value.$"] == f"States.Format('{{}}@{{}}', $$.State.Name, {where}.memory)"


def test_every_function_has_a_thin_handler_that_imports() -> None:
    for spec in TEMPLATE.functions().values():
        path = spec.code_dir / "app.py"
        assert path.is_file(), path
        module_spec = importlib.util.spec_from_file_location(f"check_{spec.logical_id}", path)
        assert module_spec is not None and module_spec.loader is not None  # the file exists
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        assert callable(module.handler)
        assert len(path.read_text().splitlines()) < 20, f"{path} is not thin"


def test_the_interpreter_loads_the_substituted_definition() -> None:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    definition = TEMPLATE.definition(lambda lid: f"arn:aws:lambda:us-east-1:123456789012:function:{lid}")
    AmazonStateLanguageParser.parse(definition)
    doc = json.loads(definition)
    for name, state in _states(doc):
        if state["Type"] == "Map":
            assert "MaxConcurrency" in state or "MaxConcurrencyPath" in state, f"{name}: unbounded threads"
        if state["Type"] == "Task":
            assert "Retry" in state, f"{name} retries nothing"


def test_map_states_discard_their_outputs_so_no_state_nears_256_kb() -> None:
    doc = json.loads((ROOT / "statemachines" / "flow.asl.json").read_text())
    maps = [(n, s) for n, s in _states(doc) if s["Type"] == "Map"]
    assert maps and all(s.get("ResultPath", "x") is None for _, s in maps)


def test_a_definition_with_a_missing_substitution_is_refused(tmp_path: Path) -> None:
    (tmp_path / "statemachines").mkdir()
    (tmp_path / "statemachines" / "flow.asl.json").write_text(
        '{"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": "${Nope}", "End": true}}}'
    )
    (tmp_path / "template.yaml").write_text(
        "Resources:\n  FlowStateMachine:\n    Type: AWS::Serverless::StateMachine\n    Properties:\n"
        "      DefinitionUri: statemachines/flow.asl.json\n      DefinitionSubstitutions: {}\n"
    )
    with pytest.raises(ValueError, match="Nope"):
        Template.load(tmp_path / "template.yaml").definition(lambda lid: lid)


@pytest.mark.parametrize("name", sorted(EVENT_MODELS))
def test_every_sample_event_parses_into_its_handler_model(name: Any) -> None:
    event = json.loads((ROOT / "events" / f"{name}.json").read_text())
    EVENT_MODELS[name].model_validate(event)  # type: ignore[attr-defined]
    strict(EVENT_MODELS[name]).model_validate(event)  # type: ignore[arg-type]  # and names no field the model does not know
    assert (ROOT / "functions" / name / "app.py").is_file()


def test_the_strict_copy_of_a_handler_model_refuses_a_misspelled_field_at_any_depth() -> None:
    for part, typo in ((None, "gruop"), ("run", "drve"), ("step", "rol"), ("op", "retrys")):
        spoiled = json.loads((ROOT / "events" / "run_step.json").read_text())
        (spoiled[part] if part else spoiled)[typo] = 1
        contracts.RunStepRequest.model_validate(spoiled)  # the handler's own model lets it through
        with pytest.raises(ValidationError, match=typo):
            strict(contracts.RunStepRequest).model_validate(spoiled)


def test_there_is_a_sample_event_for_every_function_and_every_api_route() -> None:
    dirs = {spec.code_dir.name for spec in TEMPLATE.functions().values()}
    stems = {p.stem for p in (ROOT / "events").glob("*.json")}
    handlers = {s for s in stems if not s.startswith("api_")}
    assert handlers == set(EVENT_MODELS) | {"reconcile"}
    assert dirs - {"api"} == set(EVENT_MODELS) | {"reconcile"}
    assert {"api_start_run", "api_list_runs", "api_get_run", "api_stop_run", "api_answer_approval"} <= stems
