"""Park: the run waits for a person at an approval; this drive ends."""

from laneflow.actions import park_run
from laneflow.contracts import ParkRequest
from laneflow.services import services


def handler(event, context):
    return park_run(services(), ParkRequest.model_validate(event)).model_dump(mode="json")
