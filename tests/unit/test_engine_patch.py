"""The one moto internal the local engine replaces. If moto moves it, these fail loudly
instead of the engine silently calling a real Lambda endpoint."""

from __future__ import annotations

import importlib.metadata
import inspect

from laneflow.adapters.engine import local


def test_moto_is_the_exact_version_the_hook_was_written_for():
    assert importlib.metadata.version("moto") == "5.2.5"


def test_the_hooked_function_exists_with_the_expected_signature():
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    local.install_interpreter_hook()
    assert lambda_eval_utils._invoke_lambda_function is local._invoke_in_process
    params = list(inspect.signature(lambda_eval_utils.execute_lambda_function_integration).parameters)
    assert params == ["env", "parameters", "region", "state_credentials"]
    # the integration looks the function up at call time (a module global), so the hook is used
    source = inspect.getsource(lambda_eval_utils.execute_lambda_function_integration)
    assert "_invoke_lambda_function(" in source


def _registry(tmp_path, leaving=None) -> local.HandlerRegistry:
    """A registry of one function F, without reading a template."""
    import threading

    registry = local.HandlerRegistry.__new__(local.HandlerRegistry)
    registry.functions = {"F": local.FunctionSpec("F", tmp_path, "app.handler")}
    registry._modules = {}
    registry._lock = threading.Lock()
    registry.leaving = leaving
    registry._running = 0
    registry._idle = threading.Condition()
    return registry


def test_a_handler_exception_crosses_as_a_lambda_function_error_named_by_its_class(tmp_path):
    class Boom(Exception):
        pass

    registry = _registry(tmp_path)

    def raising(event, context):
        raise Boom("it broke")

    registry._handler = lambda logical_id: raising  # type: ignore[method-assign]
    answer = registry.invoke("arn:aws:lambda:us-east-1:123456789012:function:F", {})
    assert answer["FunctionError"] == "Unhandled"
    assert answer["Payload"]["errorType"] == "Boom" and answer["Payload"]["errorMessage"] == "it broke"
    assert registry.invoke("arn:aws:lambda:us-east-1:123456789012:function:Nope", {})["Payload"]["errorType"] == "ResourceNotFoundException"


def test_a_leaving_worker_runs_no_handler_and_waits_for_those_still_running(tmp_path):
    import threading
    import time

    leaving = threading.Event()
    registry = _registry(tmp_path, leaving)
    entered, release, calls = threading.Event(), threading.Event(), []

    def slow(event, context):
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
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    assert registry.wait_idle(5) is True and time.monotonic() - started < 2
    running.join(5)


def test_the_ecs_integration_hook_wraps_the_method_the_interpreter_calls_once():
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service, state_task_service_ecs
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    local.install_interpreter_hook()
    local.install_interpreter_hook()  # idempotent: wrapped once
    hooked = state_task_service_ecs.StateTaskServiceEcs._eval_service_task
    assert hooked.original.__qualname__ == "StateTaskServiceEcs._eval_service_task"
    assert "_eval_service_task(" in inspect.getsource(state_task_service.StateTaskService._eval_execution)
    params = list(inspect.signature(hooked.original).parameters)
    assert params == ["self", "env", "resource_runtime_part", "normalised_parameters", "state_credentials"]
    assert CallbackEndpoint.setup_heartbeat_endpoint.original.__qualname__ == "CallbackEndpoint.setup_heartbeat_endpoint"


def test_an_outcome_before_the_heartbeat_endpoint_exists_is_heard_at_once():
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint, CallbackOutcomeSuccess

    local.install_interpreter_hook()
    endpoint = CallbackEndpoint("token")
    endpoint.notify(CallbackOutcomeSuccess("token", "{}"))  # the worker was faster than the state
    heartbeat = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=120)
    assert heartbeat.clear_and_wait() is True  # not a 120-second wait


def test_the_overrides_environment_is_read_in_the_definitions_casing_and_in_boto3s():
    definition = {"Overrides": {"ContainerOverrides": [{"Name": "step", "Environment": [{"Name": "A", "Value": "1"}]}]}}
    boto = {"overrides": {"containerOverrides": [{"name": "step", "environment": [{"name": "A", "value": "1"}]}]}}
    assert local.overrides_environment(definition) == local.overrides_environment(boto) == {"A": "1"}
