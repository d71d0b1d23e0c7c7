"""StepCrashed: the Catch of RunStep; ends the attempt its failed worker left running."""

from laneflow.contracts import StepCrashedRequest
from laneflow.drive import step_crashed
from laneflow.services import services


def handler(event, context):
    return step_crashed(services(), StepCrashedRequest.model_validate(event)).model_dump(mode="json")
