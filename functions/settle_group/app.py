"""SettleGroup: What a finished group means for the run: next, rescues, a loop, or the end. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import SettleGroupRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.settle_group import settle_group
from laneflow.wiring import services


@lambda_handler
@event_parser(model=SettleGroupRequest)
def handler(event: SettleGroupRequest, context: LambdaContext) -> dict[str, Any]:
    return settle_group(services(), event).model_dump(mode="json")
