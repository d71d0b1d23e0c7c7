"""StartDrive: claim a drive of a run (thin handler: parse, one domain call, shape)."""

from laneflow.contracts import StartDriveRequest
from laneflow.drive import start_drive
from laneflow.services import services


def handler(event, context):
    return start_drive(services(), StartDriveRequest.model_validate(event)).model_dump(mode="json")
