"""NextGroup: Plan what the drive does next (run a group's lanes, settle, park, or end). (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.contracts import NextGroupRequest
from laneflow.drive import next_group
from laneflow.observability import lambda_handler
from laneflow.services import services


@lambda_handler
@event_parser(model=NextGroupRequest)
def handler(event: NextGroupRequest, context):
    return next_group(services(), event).model_dump(mode="json")
