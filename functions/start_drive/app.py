"""StartDrive: claim a drive of a run (thin handler: parse, one domain call, shape)."""

from laneflow.contracts import StartDriveRequest
from laneflow.drive import start_drive
from laneflow.services import services
from laneflow.workers import current_worker


def handler(event, context):
    return start_drive(services(), StartDriveRequest.model_validate(event), worker=current_worker(context)).model_dump(mode="json")
