"""RunStep: Claim the step's next attempt, build its prompt and execute it. (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.contracts import RunStepRequest
from laneflow.step import run_step
from laneflow.observability import lambda_handler
from laneflow.services import services
from laneflow.workers import current_worker


@lambda_handler
@event_parser(model=RunStepRequest)
def handler(event: RunStepRequest, context):
    return run_step(services(), event, worker=current_worker(context)).model_dump(mode="json")
