"""EndRun: Close the run (status, finished_at, cost) and tell the on-end hook. (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.contracts import EndRunRequest
from laneflow.drive import end_run
from laneflow.observability import lambda_handler
from laneflow.services import services


@lambda_handler
@event_parser(model=EndRunRequest)
def handler(event: EndRunRequest, context):
    return end_run(services(), event).model_dump(mode="json")
