"""StepCrashed: The Catch of a step: ends the attempt its failed worker left running. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import StepCrashedRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.step_crashed import step_crashed
from laneflow.wiring import services


@lambda_handler
@event_parser(model=StepCrashedRequest)
def handler(event: StepCrashedRequest, context: LambdaContext) -> dict[str, Any]:
    return step_crashed(services(), event).model_dump(mode="json")
