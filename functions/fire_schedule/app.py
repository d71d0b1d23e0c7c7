"""FireSchedule (EventBridge Scheduler's target): start the run of one firing of a schedule,
once, however often Scheduler delivers it (thin handler)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.schedules import FireScheduleRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.fire_schedule import delivered
from laneflow.wiring import services


@lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    req = FireScheduleRequest.model_validate(event)
    return delivered(services(), req.tenant, req.schedule_id, req.scheduled_at)
