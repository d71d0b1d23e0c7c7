"""Completing a state machine's callback tokens (`.waitForTaskToken`): the port, and its
Step Functions adapter. The local engine has its own adapter (engine/local.py)."""

from __future__ import annotations

import json
import threading
from typing import Any, Protocol


class TokenGone(Exception):
    """The token names no task that is still waiting (completed, timed out, execution ended)."""


class TaskCallbacks(Protocol):
    def succeed(self, token: str, output: dict[str, Any]) -> None:
        """Complete the waiting task with `output`. Raises TokenGone if nothing waits on it."""

    def fail(self, token: str, error: str, cause: str) -> None:
        """Fail the waiting task with an error name the definition can catch."""


class StepFunctionsCallbacks:
    """SendTaskSuccess / SendTaskFailure through boto3 (the cloud adapter)."""

    def __init__(self, client: Any | None = None):
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.client("stepfunctions")
            return self._client

    def _call(self, method: str, **kwargs: Any) -> None:
        errors = self.client.exceptions
        try:
            getattr(self.client, method)(**kwargs)
        except (errors.TaskDoesNotExist, errors.TaskTimedOut, errors.InvalidToken) as exc:
            raise TokenGone(str(exc)) from None

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        self._call("send_task_success", taskToken=token, output=json.dumps(output))

    def fail(self, token: str, error: str, cause: str) -> None:
        self._call("send_task_failure", taskToken=token, error=error, cause=cause[:32000])
