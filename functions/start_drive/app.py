"""StartDrive: Claim a drive of a run. (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.domain.messages import StartDriveRequest
from laneflow.usecases.start_drive import start_drive
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.wiring import services
from laneflow.adapters.workers import current_worker


@lambda_handler
@event_parser(model=StartDriveRequest)
def handler(event: StartDriveRequest, context):
    return start_drive(services(), event, worker=current_worker(context)).model_dump(mode="json")
