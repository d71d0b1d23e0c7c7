"""ParkRun: The run waits for a person at an approval; this drive ends. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import ParkRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.park_run import park_run
from laneflow.wiring import services


@lambda_handler
@event_parser(model=ParkRequest)
def handler(event: ParkRequest, context: LambdaContext) -> dict[str, Any]:
    return park_run(services(), event).model_dump(mode="json")
