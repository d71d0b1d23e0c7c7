"""NextDrive: the execution's history budget is spent; start a fresh execution of the same drive. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import NextDriveRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.next_drive import next_drive
from laneflow.wiring import services


@lambda_handler
@event_parser(model=NextDriveRequest)
def handler(event: NextDriveRequest, context: LambdaContext) -> dict[str, Any]:
    return next_drive(services(), event).model_dump(mode="json")
