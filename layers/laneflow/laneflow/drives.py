"""Starting a drive of a run: a new execution of the flow state machine (the cloud), or the
embedded engine on a thread of this process (`laneflow serve`)."""

from __future__ import annotations

import json
import secrets
from typing import Any, Protocol


class DriveStarter(Protocol):
    def start(self, tenant: str, run_id: str) -> str:
        """Start a new drive of the run; returns the execution's id."""


class StepFunctionsDrives:
    """StartExecution on the deployed state machine."""

    def __init__(self, state_machine_arn: str, client: Any | None = None):
        self.arn, self._client = state_machine_arn, client

    def start(self, tenant: str, run_id: str) -> str:
        if self._client is None:
            import boto3

            self._client = boto3.client("stepfunctions")
        name = f"{run_id}-{secrets.token_hex(4)}"[:80]
        out = self._client.start_execution(stateMachineArn=self.arn, name=name, input=json.dumps({"tenant": tenant, "run_id": run_id}))
        return out["executionArn"]
