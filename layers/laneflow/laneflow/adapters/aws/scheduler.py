"""Schedules' triggers in the cloud: one EventBridge Scheduler schedule per laneflow
schedule, in the stack's schedule group (template.yaml's ScheduleGroup).

Each takes the schedule's own expression and zone (EventBridge's syntax is laneflow's), is
ENABLED or DISABLED with it, and targets the function that fires schedules
(functions/fire_schedule) through a role that may invoke only that function. Its Input names
the tenant and the schedule, and the firing's time from Scheduler's context attribute
`<aws.scheduler.scheduled-time>`, so every delivery of one firing names the same run. A
delivery that fails is retried (RETRY), then kept in the dead-letter queue the stack
alarms on. A rate schedule's first firing is one period after its creation, as locally.

A schedule's name is its id and a digest of its tenant's name (a tenant name may hold
characters a name may not, and two tenants' ids never meet in one group)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from laneflow.domain import schedule_expressions as expressions
from laneflow.domain.errors import InvalidInput, LaneflowError, Problem, TransientError
from laneflow.domain.schedules import Schedule, ScheduleState

if TYPE_CHECKING:
    from types_boto3_scheduler import EventBridgeSchedulerClient

# A firing Scheduler could not deliver is tried again this often, for at most this long (a
# firing an hour late is one the next catches up with), then kept in the dead-letter queue.
RETRY = {"MaximumRetryAttempts": 3, "MaximumEventAgeInSeconds": 3600}

SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"

_THROTTLED = frozenset({"ThrottlingException", "ServiceQuotaExceededException", "InternalServerException"})


def schedule_name(schedule: Schedule) -> str:
    """The Scheduler schedule's name: `sch-...-<8 hex of the tenant>`."""
    return f"{schedule.id}-{hashlib.sha256(schedule.tenant.encode()).hexdigest()[:8]}"


def target_input(schedule: Schedule) -> str:
    """What the fire function receives for each firing (laneflow.domain.schedules.FireScheduleRequest)."""
    return json.dumps({"tenant": schedule.tenant, "schedule_id": schedule.id, "scheduled_at": SCHEDULED_TIME})


class SchedulerTriggers:
    """`ScheduleTriggers` over EventBridge Scheduler: `group` the schedule group, `target` the
    fire function's ARN, `role` the role Scheduler invokes it with, `dead_letter` the queue's
    ARN."""

    def __init__(
        self,
        group: str,
        target: str,
        role: str,
        dead_letter: str | None = None,
        *,
        client: EventBridgeSchedulerClient | None = None,
    ) -> None:
        self.group, self.target, self.role, self.dead_letter = group, target, role, dead_letter
        self._client = client

    @property
    def client(self) -> EventBridgeSchedulerClient:
        if self._client is None:
            import boto3

            self._client = boto3.client("scheduler")
        return self._client

    def params(self, schedule: Schedule) -> dict[str, Any]:
        """The CreateSchedule (or, whole, UpdateSchedule) request of a schedule."""
        target: dict[str, Any] = {"Arn": self.target, "RoleArn": self.role, "Input": target_input(schedule), "RetryPolicy": RETRY}
        if self.dead_letter:
            target["DeadLetterConfig"] = {"Arn": self.dead_letter}
        params: dict[str, Any] = {
            "Name": schedule_name(schedule),
            "GroupName": self.group,
            "ScheduleExpression": schedule.expression,
            "ScheduleExpressionTimezone": schedule.timezone,
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "State": "ENABLED" if schedule.state == ScheduleState.enabled else "DISABLED",
            "Description": f"laneflow: {schedule.workspace}/{schedule.flow} of tenant {schedule.tenant}"[:512],
            "Target": target,
        }
        parsed = schedule.parsed
        if parsed.kind == "rate":  # as locally: one period after it was made
            params["StartDate"] = expressions.minute(schedule.anchor) + dt.timedelta(seconds=parsed.every_s)
        return params

    def put(self, schedule: Schedule) -> None:
        try:
            self._call("create_schedule", **self.params(schedule))
        except _Exists:
            self._call("update_schedule", **self.params(schedule))

    def set_state(self, schedule: Schedule) -> None:
        self._call("update_schedule", **self.params(schedule))

    def delete(self, schedule: Schedule) -> None:
        try:
            self._call("delete_schedule", Name=schedule_name(schedule), GroupName=self.group)
        except _Missing:
            pass  # gone already: what was asked

    def get(self, schedule: Schedule) -> dict[str, Any]:
        """The Scheduler schedule as it is now (for operators and tests)."""
        answer: dict[str, Any] = dict(self.client.get_schedule(Name=schedule_name(schedule), GroupName=self.group))
        return answer

    def _call(self, method: str, **params: Any) -> None:
        try:
            getattr(self.client, method)(**params)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            message = error.response.get("Error", {}).get("Message", "") or code
            if code == "ConflictException":
                raise _Exists() from None
            if code == "ResourceNotFoundException":
                raise _Missing() from None
            if code in _THROTTLED:
                raise TransientError(f"EventBridge Scheduler is busy ({code}); try again") from None
            if code == "ValidationException":
                raise InvalidInput(
                    f"expression: EventBridge Scheduler refused it: {message}",
                    [Problem(file="schedule", field="expression", message=message)],
                ) from None
            raise LaneflowError(f"EventBridge Scheduler refused {method} ({code})") from error


class _Exists(Exception):
    pass


class _Missing(Exception):
    pass
