"""The moto internals the local engine replaces (its Lambda call, the execution a call serves,
JSONPath parsing, what moto keeps of ended executions). If moto moves one, these fail loudly
instead of the engine silently calling a real Lambda endpoint, answering with another
drive's services, slowing down, or growing without end."""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laneflow.adapters.engine import local
from laneflow.adapters.engine.template import FunctionSpec


def test_moto_is_the_exact_version_the_hook_was_written_for() -> None:
    assert importlib.metadata.version("moto") == "5.2.5"


def test_the_hooked_function_exists_with_the_expected_signature() -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    local.install_interpreter_hook()
    assert lambda_eval_utils._invoke_lambda_function is local._invoke_in_process
    params = list(inspect.signature(lambda_eval_utils.execute_lambda_function_integration).parameters)
    assert params == ["env", "parameters", "region", "state_credentials"]
    # the integration looks the function up at call time (a module global), so the hook is used
    source = inspect.getsource(lambda_eval_utils.execute_lambda_function_integration)
    assert "_invoke_lambda_function(" in source


def _registry(tmp_path: Path, leaving: Any = None) -> local.HandlerRegistry:
    """A registry of one function F, without reading a template."""
    import threading

    registry = local.HandlerRegistry.__new__(local.HandlerRegistry)
    registry.functions = {"F": FunctionSpec("F", tmp_path, "app.handler")}
    registry._modules = {}
    registry._lock = threading.Lock()
    registry.leaving = leaving
    registry.bind = None
    registry._running = 0
    registry._idle = threading.Condition()
    registry.step_workers = None
    registry.worker_functions = set()
    registry.wait_functions, registry.early = set(), None
    return registry


def test_a_handler_exception_crosses_as_a_lambda_function_error_named_by_its_class(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    registry = _registry(tmp_path)

    def raising(event: Any, context: Any) -> None:
        raise Boom("it broke")

    registry._handler = lambda logical_id: raising  # type: ignore[method-assign]
    answer = registry.invoke("arn:aws:lambda:us-east-1:123456789012:function:F", {})
    assert answer["FunctionError"] == "Unhandled"
    assert answer["Payload"]["errorType"] == "Boom" and answer["Payload"]["errorMessage"] == "it broke"
    assert (
        registry.invoke("arn:aws:lambda:us-east-1:123456789012:function:Nope", {})["Payload"]["errorType"]
        == "ResourceNotFoundException"
    )


def test_a_leaving_worker_runs_no_handler_and_waits_for_those_still_running(tmp_path: Path) -> None:
    import threading

    leaving = threading.Event()
    registry = _registry(tmp_path, leaving)
    entered, release, calls = threading.Event(), threading.Event(), []

    def slow(event: Any, context: Any) -> dict[str, Any]:
        calls.append(event)
        entered.set()
        release.wait(5)
        return {"ok": True}

    registry._handler = lambda logical_id: slow  # type: ignore[method-assign]
    arn = "arn:aws:lambda:us-east-1:123456789012:function:F"
    running = threading.Thread(target=registry.invoke, args=(arn, {"n": 1}))
    running.start()
    assert entered.wait(5)
    leaving.set()
    refused = registry.invoke(arn, {"n": 2})
    assert refused["Payload"]["errorType"] == "WorkerLeaving" and calls == [{"n": 1}]
    assert registry.wait_idle(0.1) is False  # the first is still running
    # Once the running one ends, the wait ends: well before its 60 s timeout
    idle: list[bool] = []
    waiting = threading.Thread(target=lambda: idle.append(registry.wait_idle(60)))
    waiting.start()
    release.set()
    waiting.join(30)
    assert not waiting.is_alive(), "the wait outlasted the call it waited for"
    assert idle == [True]
    running.join(5)


def test_the_lambda_integration_notes_the_execution_it_serves_on_the_calling_thread() -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    from laneflow.adapters.engine import moto_patches

    local.install_interpreter_hook()
    integration = lambda_eval_utils.execute_lambda_function_integration
    assert getattr(integration, "__laneflow_patch__", False), "the integration is not wrapped"
    # the wrapper sits over moto's own function, which still calls the hooked one
    assert "_invoke_lambda_function(" in inspect.getsource(integration.__wrapped__)  # type: ignore[attr-defined]
    seen = []

    class Env:  # what the wrapper and moto's integration read of a state's environment
        stack: list[Any] = []

        def is_mocked_mode(self) -> bool:
            return False

        class states:
            class context_object:
                context_object_data = {"Execution": {"Id": "arn:aws:states:us-east-1:1:execution:m:e1"}}

    def fake_invoke(parameters: Any, region: Any, state_credentials: Any) -> dict[str, Any]:
        seen.append(moto_patches.current_execution())
        return {"StatusCode": 200, "Payload": {}}

    original = lambda_eval_utils._invoke_lambda_function
    lambda_eval_utils._invoke_lambda_function = fake_invoke
    try:
        integration(Env(), {"FunctionName": "F", "Payload": b"{}"}, "us-east-1", None)  # type: ignore[arg-type]
    finally:
        lambda_eval_utils._invoke_lambda_function = original
    assert seen == ["arn:aws:states:us-east-1:1:execution:m:e1"]
    assert moto_patches.current_execution() is None  # only for the call's duration


def test_a_lambda_call_of_an_execution_no_drive_serves_is_refused_not_answered_by_another() -> None:
    from laneflow.adapters.engine import moto_patches

    local.install_interpreter_hook()
    assert moto_patches.current_execution() is None
    answer = local._invoke_in_process({"FunctionName": "F", "Payload": b"{}"}, "us-east-1", None)
    assert answer["FunctionError"] == "Unhandled" and answer["Payload"]["errorType"] == "ServiceException"


def test_the_execution_arn_the_engine_expects_is_the_one_moto_gives() -> None:
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    source = inspect.getsource(StepFunctionsParserBackend.start_execution)
    assert '"arn:{}:states:{}:{}:execution:{}:{}"' in source
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:laneflow-flow-abc"
    assert local.execution_arn(machine, "r1-ff") == "arn:aws:states:us-east-1:123456789012:execution:laneflow-flow-abc:r1-ff"


def test_jsonpath_parses_are_memoized_in_both_places_moto_parses_and_still_evaluate() -> None:
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    local.install_interpreter_hook()
    for module in (json_path, result_path):
        assert getattr(module.parse, "__laneflow_patch__", False), module.__name__
        assert module.parse("$.plan.lanes") is module.parse("$.plan.lanes")  # parsed once
    # moto's functions still read the patched module global, and answer as before
    assert "parse(path)" in inspect.getsource(json_path.extract_json)
    assert "parse(self.result_path_src)" in inspect.getsource(result_path.ResultPath._eval_body)
    assert json_path.extract_json("$.a.b", {"a": {"b": 2}}) == 2
    assert json_path.extract_json("$.a[*].b", {"a": [{"b": 1}, {"b": 2}]}) == [1, 2]
    data = {"x": 1}
    assert result_path.parse("$.r").update_or_create(data, {"y": 2}) == {"x": 1, "r": {"y": 2}}  # type: ignore[attr-defined]
    assert result_path.parse("$.r").update_or_create({"x": 3}, 4) == {"x": 3, "r": 4}  # type: ignore[attr-defined]  # the cached path kept nothing


def test_every_module_that_evaluates_a_path_gets_the_walk_and_a_plain_path_is_walked_through_dicts_only() -> None:
    from jsonpath_ng import jsonpath

    from laneflow.adapters.engine import moto_patches

    local.install_interpreter_hook()
    for name in moto_patches.EXTRACT_JSON_USERS:
        module = importlib.import_module(name)
        assert getattr(module.extract_json, "__laneflow_patch__", False), name
        assert "extract_json(" in inspect.getsource(module), name  # moto still evaluates paths through it there
    plain = moto_patches._plain_names
    parse = importlib.import_module("moto.stepfunctions.parser.asl.utils.json_path").parse
    assert plain(parse("$")) == () and plain(parse("$.plan.lanes")) == ("plan", "lanes")
    for other in ("$.a[0]", "$.a.*", "$.a..b", "$.a[*].b"):
        assert plain(parse(other)) is None, other
    assert type(parse("$.a")) is jsonpath.Child  # what the walk recognises is jsonpath-ng's own tree


def test_a_walked_path_answers_what_jsonpath_ng_answers_for_any_json_and_fails_the_same_way() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from moto.stepfunctions.parser.asl.utils import json_path

    local.install_interpreter_hook()
    walked = json_path.extract_json
    original = walked.__wrapped__  # type: ignore[attr-defined]
    names = st.sampled_from(["a", "b", "run", "plan", "lanes", "x_1", "where", "True"])
    leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=3)
    values = st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=4), max_leaves=12
    )
    step = st.one_of(names.map(lambda n: f".{n}"), names.map(lambda n: f"['{n}']"))  # both spellings jsonpath-ng reads as a name
    paths = st.lists(step, max_size=4).map(lambda parts: "$" + "".join(parts))

    def outcome(fn: Callable[[Any, Any], Any], path: Any, data: Any) -> tuple[str, Any]:
        try:
            return ("value", fn(path, data))
        except Exception as error:  # the kind and text of the failure are compared
            return (type(error).__name__, str(error))

    @settings(max_examples=400, deadline=None)
    @given(path=paths, data=values)
    def same(path: Any, data: Any) -> None:
        got, want = outcome(walked, path, data), outcome(original, path, data)
        assert got == want
        if got[0] == "value" and want[0] == "value":
            assert got[1] is want[1]  # the very value, not a copy (moto copies where it must)

    same()


def test_install_is_idempotent_and_wraps_nothing_twice() -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
    from moto.stepfunctions.parser.asl.utils import json_path

    from laneflow.adapters.engine import moto_patches

    local.install_interpreter_hook()
    integration, parse, extract = lambda_eval_utils.execute_lambda_function_integration, json_path.parse, json_path.extract_json  # type: ignore[attr-defined]
    moto_patches._installed = False  # as if a second engine installed them again
    moto_patches.install()
    assert lambda_eval_utils.execute_lambda_function_integration is integration and json_path.parse is parse  # type: ignore[attr-defined]
    assert json_path.extract_json is extract


def test_forget_drops_an_ended_execution_and_moto_s_ended_threads_but_keeps_running_ones() -> None:
    import threading

    from moto.stepfunctions.parser import utils

    from laneflow.adapters.engine import moto_patches

    class Execution:
        def __init__(self, arn: str, status: Any) -> None:
            self.execution_arn, self.status = arn, status

    class Machine:
        def __init__(self, *executions: Any) -> None:
            self.executions = list(executions)

    ended, running = Execution("a", "SUCCEEDED"), Execution("b", "RUNNING")
    machine = Machine(ended, running)
    backend = type("Backend", (), {"state_machines": [machine]})()
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    release = threading.Event()
    alive = threading.Thread(target=release.wait, args=(5,))
    alive.start()
    threads = utils.TMP_THREADS
    threads.extend([done, alive])
    try:
        moto_patches.forget(backend, "a")
        moto_patches.forget(backend, "b")  # still running: kept
        assert machine.executions == [running]
        assert done not in utils.TMP_THREADS and alive in utils.TMP_THREADS
        assert utils.TMP_THREADS is threads  # the very list moto's modules append to
        from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import (
            inline_iteration_component,
        )

        assert inline_iteration_component.TMP_THREADS is utils.TMP_THREADS  # type: ignore[attr-defined]
    finally:
        release.set()
        alive.join(5)


def test_forget_drops_the_execution_s_snapshot_of_its_state_machine_from_moto_s_model_list() -> None:
    from moto.core.common_models import BaseModel
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    from laneflow.adapters.engine import moto_patches

    # moto keeps every model object it makes (for its dashboard), a deep copy too, and each
    # execution runs on a deep copy of its state machine
    assert "instances_tracked.append(instance)" in inspect.getsource(BaseModel.__new__)
    assert "state_machine_clone = copy.deepcopy(" in inspect.getsource(StepFunctionsParserBackend.start_execution)

    class Snapshot:
        instances_tracked: list[Any] = []

        def __eq__(self, other: object) -> bool:  # equal to every other: only identity says which one goes
            return True

    kept, snapshot, other = Snapshot(), Snapshot(), Snapshot()
    Snapshot.instances_tracked.extend([kept, snapshot, other])

    class Execution:
        def __init__(self, arn: str, status: Any, state_machine: Any) -> None:
            self.execution_arn, self.status, self.state_machine = arn, status, state_machine

    machine = type("Machine", (), {})()
    machine.executions = [Execution("a", "SUCCEEDED", snapshot), Execution("b", "RUNNING", other)]
    backend = type("Backend", (), {"state_machines": [machine]})()
    moto_patches.forget(backend, "a")
    moto_patches.forget(backend, "b")  # still running: its snapshot is kept with it
    tracked = Snapshot.instances_tracked
    assert len(tracked) == 2 and tracked[0] is kept and tracked[1] is other


def test_the_ecs_integration_hook_wraps_the_method_the_interpreter_calls_once() -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service, state_task_service_ecs
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    local.install_interpreter_hook()
    local.install_interpreter_hook()  # idempotent: wrapped once
    hooked = state_task_service_ecs.StateTaskServiceEcs._eval_service_task
    assert hooked.original.__qualname__ == "StateTaskServiceEcs._eval_service_task"  # type: ignore[attr-defined]
    assert "_eval_service_task(" in inspect.getsource(state_task_service.StateTaskService._eval_execution)
    params = list(inspect.signature(hooked.original).parameters)  # type: ignore[attr-defined]
    assert params == ["self", "env", "resource_runtime_part", "normalised_parameters", "state_credentials"]
    assert CallbackEndpoint.setup_heartbeat_endpoint.original.__qualname__ == "CallbackEndpoint.setup_heartbeat_endpoint"  # type: ignore[attr-defined]


def test_an_outcome_before_the_heartbeat_endpoint_exists_is_heard_at_once() -> None:
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint, CallbackOutcomeSuccess

    local.install_interpreter_hook()
    endpoint = CallbackEndpoint("token")
    endpoint.notify(CallbackOutcomeSuccess("token", "{}"))  # the worker was faster than the state
    heartbeat = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=120)
    assert heartbeat.clear_and_wait() is True  # not a 120-second wait


def test_the_overrides_environment_is_read_in_the_definitions_casing_and_in_boto3s() -> None:
    definition = {"Overrides": {"ContainerOverrides": [{"Name": "step", "Environment": [{"Name": "A", "Value": "1"}]}]}}
    boto = {"overrides": {"containerOverrides": [{"name": "step", "environment": [{"name": "A", "value": "1"}]}]}}
    assert local.overrides_environment(definition) == local.overrides_environment(boto) == {"A": "1"}


def test_a_definition_is_parsed_once_per_process_for_its_check_and_every_execution_with_its_heap_keys_made() -> None:
    import uuid

    import pytest
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent
    from moto.stepfunctions.parser.asl.parse import asl_parser
    from moto.stepfunctions.parser.asl.static_analyser import static_analyser
    from moto.stepfunctions.parser.backend import execution_worker

    local.install_interpreter_hook()
    parse = asl_parser.AmazonStateLanguageParser.parse
    assert getattr(parse, "__laneflow_patch__", False)
    # moto's two callers, the definition's check and each execution's start, call it on the class
    assert "AmazonStateLanguageParser.parse(definition)" in inspect.getsource(static_analyser.StaticAnalyser.analyse)
    assert "AmazonStateLanguageParser.parse(" in inspect.getsource(execution_worker.ExecutionWorker._get_evaluation_entrypoint)

    marker = uuid.uuid4().hex  # a definition no other test has parsed
    definition = (
        '{"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",'
        ' "Parameters": {"FunctionName": "f", "Payload": {"m": "' + marker + '"}},'
        ' "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2}], "End": true}}}'
    )
    program, tree = parse(definition)
    assert parse(definition)[0] is program and parse(definition)[1] is tree  # parsed once, then shared
    static_analyser.StaticAnalyser().analyse(definition)  # moto's check of a definition reads the kept tree

    # Made as it was parsed, deep in the tree too: the state, the two retry declarations whose
    # counters are kept under their keys, the Lambda call's payload binding
    state = program.states.states["T"]  # type: ignore[attr-defined]
    retrier = state.retry.retriers[0]
    made = [program, state, retrier.max_attempts, retrier.backoff_rate, state.parargs.template_eval_component.payload_bindings[0]]
    assert all(isinstance(c, EvalComponent) and c._EvalComponent__heap_key is not None for c in made)  # type: ignore[attr-defined]

    broken = '{"StartAt": "A", "States": {"A": {"Type": "Pass", "End": "' + marker + '"}}}'
    errors = []
    for _ in range(2):
        with pytest.raises(asl_parser.ASLParserException) as raised:
            parse(broken)
        errors.append(raised.value)
    assert errors[0] is not errors[1]  # a definition that does not parse is parsed again: nothing kept
