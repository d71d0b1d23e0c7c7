"""RunStep: claim the step's next attempt, build its prompt and execute it."""

from laneflow.contracts import RunStepRequest
from laneflow.services import services
from laneflow.workers import current_worker
from laneflow.step import run_step


def handler(event, context):
    return run_step(services(), RunStepRequest.model_validate(event), worker=current_worker(context)).model_dump(mode="json")
