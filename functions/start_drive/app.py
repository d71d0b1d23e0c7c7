"""StartDrive: Claim a drive of a run. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.adapters.workers import current_worker
from laneflow.domain.messages import StartDriveRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.start_drive import start_drive
from laneflow.wiring import services


@lambda_handler
@event_parser(model=StartDriveRequest)
def handler(event: StartDriveRequest, context: LambdaContext) -> dict[str, Any]:
    return start_drive(services(), event, worker=current_worker(context)).model_dump(mode="json")
