"""EndRun: Close the run (status, finished_at, cost) and tell the on-end hook. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import EndRunRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.end_run import end_run
from laneflow.wiring import services


@lambda_handler
@event_parser(model=EndRunRequest)
def handler(event: EndRunRequest, context: LambdaContext) -> dict[str, Any]:
    return end_run(services(), event).model_dump(mode="json")
