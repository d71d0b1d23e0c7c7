"""The embedded engine's hooks into moto's ASL interpreter: its Lambda integration answered
by the in-process handlers of the drive whose execution calls (`install_interpreter_hook`),
its ECS integration by that drive's local sandbox workers, its callback endpoint told of an
outcome that came early; and the interpreter's backend, whose tokens `LocalCallbacks`
completes (the gate's rendezvous).

Which drive serves an execution is kept here, by the execution's ARN (`serve_execution`,
`registry_of`): drives with different services run at once on one interpreter.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from laneflow.adapters.engine import held, moto_fastcopy, moto_inline, moto_lazy, moto_patches
from laneflow.adapters.engine.sandbox import Sandboxes, gone_of
from laneflow.ports import TokenGone

if TYPE_CHECKING:
    from laneflow.adapters.engine.local import HandlerRegistry

ACCOUNT = "123456789012"

REGION = "us-east-1"


def _function_error(error_type: str, message: str, stack: list[str] | None = None) -> dict[str, Any]:
    return {
        "StatusCode": 200,
        "FunctionError": "Unhandled",
        "Payload": {"errorType": error_type, "errorMessage": message, "stackTrace": stack or []},
    }


# -- the interpreter hook ------------------------------------------------------------------------

_registry_lock = threading.Lock()

# The handlers of each running drive, by the ARN of the execution they answer.
_registries: dict[str, HandlerRegistry] = {}


def serve_execution(execution_arn: str, registry: HandlerRegistry | None) -> None:
    """Answer the Lambda calls of an execution with `registry`'s handlers (None: no more)."""
    with _registry_lock:
        if registry is None:
            _registries.pop(execution_arn, None)
        else:
            _registries[execution_arn] = registry


def registry_of(execution_arn: str | None) -> HandlerRegistry | None:
    """The handlers (and so the services) of the drive that serves this execution, if any."""
    with _registry_lock:
        return _registries.get(execution_arn) if execution_arn else None


def _invoke_in_process(parameters: dict[str, Any], region: str, state_credentials: Any) -> dict[str, Any]:
    execution = moto_patches.current_execution()
    registry = registry_of(execution)
    if registry is None:
        return _function_error("ServiceException", f"the local engine drives no execution {execution}")
    raw = parameters.get("Payload")
    payload = json.loads(raw) if isinstance(raw, (bytes, str)) and raw else (raw or {})
    return registry.invoke(parameters["FunctionName"], payload)


# The sandbox workers of each running drive that has them, by the ARN of its execution.
_sandboxes: dict[str, Sandboxes] = {}


def _field(params: dict[str, Any], name: str) -> Any:
    """A request field whatever its casing (moto leaves the definition's `Overrides`, boto
    names it `overrides`)."""
    for key, value in params.items():
        if key.lower() == name.lower():
            return value
    return None


def overrides_environment(params: dict[str, Any]) -> dict[str, str]:
    """The environment a runTask's container overrides give its (first) container."""
    containers = _field(_field(params, "Overrides") or {}, "ContainerOverrides") or [{}]
    return {str(_field(e, "Name")): str(_field(e, "Value")) for e in _field(containers[0], "Environment") or []}


def _run_task_locally(original: Callable[..., Any]) -> Callable[..., Any]:
    """moto's ECS integration, answered while the engine drives by a child process running
    the sandbox worker (its token and request in its environment, as the task's overrides
    give them); outside a drive (a test under `mock_aws`), moto's own."""

    def run_task(
        self: Any, env: Any, resource_runtime_part: Any, normalised_parameters: dict[str, Any], state_credentials: Any
    ) -> None:
        with _registry_lock:
            sandboxes = _sandboxes.get(moto_patches.execution_of(env) or "")
        if sandboxes is None:
            return original(self, env, resource_runtime_part, normalised_parameters, state_credentials)  # type: ignore[no-any-return]
        child = sandboxes.launch(overrides_environment(normalised_parameters))
        task = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/local/{child.pid}"
        env.stack.append(
            {"Tasks": [{"TaskArn": task, "ClusterArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/local", "LastStatus": "RUNNING"}]}
        )
        return None

    run_task.original = original  # type: ignore[attr-defined]
    return run_task


def install_interpreter_hook() -> None:
    """Point moto's Lambda integration at the in-process handlers, and its ECS integration
    at local sandbox workers (idempotent)."""
    moto_lazy.install()  # first: moto's Batch model (and EC2's) stays out until a definition names Batch
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
        lambda_eval_utils,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_ecs import (
        StateTaskServiceEcs,
    )

    if not hasattr(lambda_eval_utils, "_invoke_lambda_function"):  # pragma: no cover - guarded by a test
        raise RuntimeError("moto's Step Functions interpreter changed: lambda_eval_utils._invoke_lambda_function is gone")
    lambda_eval_utils._invoke_lambda_function = _invoke_in_process
    ecs_task = StateTaskServiceEcs._eval_service_task
    if not hasattr(ecs_task, "original"):
        StateTaskServiceEcs._eval_service_task = _run_task_locally(ecs_task)  # type: ignore[method-assign]
    _hear_an_early_outcome()
    moto_patches.install()
    moto_inline.install()
    moto_fastcopy.install()


def _hear_an_early_outcome() -> None:
    """A fix to moto's callback endpoint (idempotent). A task with `HeartbeatSeconds` waits
    on its heartbeat endpoint, made only once the task was submitted; a worker that completes
    the token before that (a fast child process, a worker failing at once) notified no
    endpoint, so the state sat until its heartbeat timed out. The endpoint made after an
    outcome now starts notified, and the state sees the outcome at once."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    setup = CallbackEndpoint.setup_heartbeat_endpoint
    if hasattr(setup, "original"):
        return

    def setup_heartbeat_endpoint(self: Any, heartbeat_seconds: int) -> Any:
        endpoint = setup(self, heartbeat_seconds)
        if self.get_outcome() is not None:
            endpoint.notify()  # type: ignore[no-untyped-call]
        return endpoint

    setup_heartbeat_endpoint.original = setup  # type: ignore[attr-defined]
    CallbackEndpoint.setup_heartbeat_endpoint = setup_heartbeat_endpoint  # type: ignore[method-assign]


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN moto gives an execution named `name` of the state machine."""
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"


def _backend() -> Any:
    moto_lazy.install()
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    return stepfunctions_parser_backends[ACCOUNT][REGION]


class LocalCallbacks:
    """Completes callback tokens on the in-process interpreter (the gate's rendezvous)."""

    def _call(self, method: str, *args: Any) -> None:
        from moto.stepfunctions.parser.api import (
            InvalidToken,
            TaskDoesNotExist,
            TaskTimedOut,
        )

        try:
            getattr(_backend(), method)(*args)
        except (InvalidToken, TaskDoesNotExist, TaskTimedOut) as exc:
            raise TokenGone(type(exc).__name__) from None

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        self._call("send_task_success", token, json.dumps(output))

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        gate = output.get("gate")
        if isinstance(gate, str):
            # A lead's release: its readied siblings' requests go first (held.py), in this
            # process and in every step worker, before the interpreter resumes their iterations.
            held.release(gate, replied=bool(output.get("replied")))
        return gone_of(self.succeed, tokens, output)

    def fail(self, token: str, error: str, cause: str) -> None:
        self._call("send_task_failure", token, error, cause)

    def heartbeat(self, token: str) -> None:
        self._call("send_task_heartbeat", token)
