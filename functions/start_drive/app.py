"""StartDrive: Claim a drive of a run. (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.contracts import StartDriveRequest
from laneflow.drive import start_drive
from laneflow.observability import lambda_handler
from laneflow.services import services
from laneflow.workers import current_worker


@lambda_handler
@event_parser(model=StartDriveRequest)
def handler(event: StartDriveRequest, context):
    return start_drive(services(), event, worker=current_worker(context)).model_dump(mode="json")
