"""Completing a state machine's callback tokens (`.waitForTaskToken`): the port, and its
Step Functions adapter. The local engine has its own adapter (engine/local.py)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from laneflow.adapters.aws.clients import LazyClient
from laneflow.domain.messages import ExecutionInput
from laneflow.ports import TokenGone

if TYPE_CHECKING:
    from types_boto3_stepfunctions import SFNClient

RELEASE_THREADS = 16  # SendTaskSuccess calls in flight when a lead releases its siblings


class StepFunctionsCallbacks(LazyClient["SFNClient"]):
    """SendTaskSuccess / SendTaskFailure through boto3 (the cloud adapter)."""

    service = "stepfunctions"

    def _call(self, send: Callable[[SFNClient], object]) -> None:
        """`send` with the client; a token Step Functions no longer knows is `TokenGone`."""
        errors = self.client.exceptions
        try:
            send(self.client)
        except (errors.TaskDoesNotExist, errors.TaskTimedOut, errors.InvalidToken) as exc:
            raise TokenGone(str(exc)) from None

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        body = json.dumps(output)
        self._call(lambda sfn: sfn.send_task_success(taskToken=token, output=body))

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        """SendTaskSuccess for each token, up to RELEASE_THREADS at once (a lead releasing 99
        siblings one call after another would start the last ~2 s after the first)."""

        def one(token: str) -> str | None:
            try:
                self.succeed(token, output)
            except TokenGone:
                return token
            return None

        if len(tokens) <= 1:
            return [t for t in map(one, tokens) if t]
        with ThreadPoolExecutor(max_workers=min(RELEASE_THREADS, len(tokens))) as pool:
            return [t for t in pool.map(one, tokens) if t]

    def fail(self, token: str, error: str, cause: str) -> None:
        cause = cause[:32000]
        self._call(lambda sfn: sfn.send_task_failure(taskToken=token, error=error, cause=cause))

    def heartbeat(self, token: str) -> None:
        self._call(lambda sfn: sfn.send_task_heartbeat(taskToken=token))


class StepFunctionsDrives(LazyClient["SFNClient"]):
    """StartExecution on the deployed state machine."""

    service = "stepfunctions"

    def __init__(self, state_machine_arn: str, client: SFNClient | None = None):
        super().__init__(client)
        self.arn = state_machine_arn

    def start(self, tenant: str, run_id: str) -> str:
        name = f"{run_id}-{secrets.token_hex(4)}"[:80]
        out = self.client.start_execution(
            stateMachineArn=self.arn, name=name, input=json.dumps({"tenant": tenant, "run_id": run_id})
        )
        return str(out["executionArn"])

    def continue_drive(self, start: ExecutionInput, name: str) -> str:
        """StartExecution of the continuation `name`. Step Functions answers a second start of
        a running execution with the same name and input with that execution; one that has
        already ended with ExecutionAlreadyExists: the same execution, whose ARN the name gives."""
        try:
            out = self.client.start_execution(stateMachineArn=self.arn, name=name, input=start.model_dump_json())
        except self.client.exceptions.ExecutionAlreadyExists:
            return self.arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"
        return str(out["executionArn"])


def execution_alive(client: SFNClient | None = None) -> Callable[[str], bool | None]:
    """Step Functions' answer to "is this drive still running?" (the cloud liveness)."""

    def alive(arn: str) -> bool | None:
        nonlocal client
        if client is None:
            import boto3

            client = boto3.client("stepfunctions")
        try:
            return bool(client.describe_execution(executionArn=arn)["status"] == "RUNNING")
        except client.exceptions.ExecutionDoesNotExist:
            return False

    return alive
