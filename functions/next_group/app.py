"""NextGroup: Plan what the drive does next (run a group's lanes, settle, park, or end). (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import NextGroupRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.next_group import next_group
from laneflow.wiring import services


@lambda_handler
@event_parser(model=NextGroupRequest)
def handler(event: NextGroupRequest, context: LambdaContext) -> dict[str, Any]:
    return next_group(services(), event).model_dump(mode="json")
