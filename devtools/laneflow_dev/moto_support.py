"""Running the engine's threads against moto's DynamoDB (tests, benchmarks).

moto's DynamoDB is not thread-safe: a refused transaction restores a deep copy of the whole
table it took before, undoing other threads' writes meanwhile. DynamoDB itself serializes
writes to an item, so serializing moto's request handling keeps its semantics."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

_LOCK = threading.RLock()


@contextlib.contextmanager
def serialized_dynamodb() -> Iterator[None]:
    from moto.dynamodb.responses import DynamoHandler

    handle = DynamoHandler.call_action

    def call_action(self):  # type: ignore[no-untyped-def]
        with _LOCK:
            return handle(self)

    with mock.patch.object(DynamoHandler, "call_action", call_action):
        yield


def _ecs_operation(self: Any, service_action_name: str | None) -> Any:
    import botocore.session

    model = botocore.session.get_session().get_service_model("ecs")
    action = self._get_boto_service_action(service_action_name).replace("_", "")
    name = next(n for n in model.operation_names if n.lower() == action)
    return model.operation_model(name)


@contextlib.contextmanager
def ecs_in_step_functions() -> Iterator[None]:
    """moto's Step Functions interpreter calling moto's ECS, as Step Functions calls ECS.

    moto 5.2.5 ships the ECS integration (`ecs:runTask`, `.sync`, `.waitForTaskToken`) but
    stubs out the request and response normalisation it needs: the definition's `Cluster`,
    `Overrides`... reach boto3 as they are (KeyError: 'Cluster', so States.Runtime), and the
    response is read as `Tasks[0].TaskArn` while boto3 answers `tasks[0].taskArn`. This puts
    back what LocalStack does there, from the ECS service model: nothing else changes."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_ecs import (
        StateTaskServiceEcs,
    )

    def normalise_parameters(self, parameters, boto_service_name=None, service_action_name=None):  # type: ignore[no-untyped-def]
        self._to_boto_request(parameters, _ecs_operation(self, service_action_name).input_shape)

    def normalise_response(self, response, boto_service_name=None, service_action_name=None):  # type: ignore[no-untyped-def]
        self._from_boto_response(response, _ecs_operation(self, service_action_name).output_shape)

    with (
        mock.patch.object(StateTaskServiceEcs, "_normalise_parameters", normalise_parameters),
        mock.patch.object(StateTaskServiceEcs, "_normalise_response", normalise_response),
    ):
        yield
