"""EndRun: close the run (status, finished_at)."""

from laneflow.contracts import EndRunRequest
from laneflow.drive import end_run
from laneflow.services import services


def handler(event, context):
    return end_run(services(), EndRunRequest.model_validate(event)).model_dump(mode="json")
