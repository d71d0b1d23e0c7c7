"""RunStep: Claim the step's next attempt, build its prompt and execute it. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.adapters.workers import current_worker
from laneflow.domain.messages import RunStepRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.run_step.runner import run_step
from laneflow.wiring import services


@lambda_handler
@event_parser(model=RunStepRequest)
def handler(event: RunStepRequest, context: LambdaContext) -> dict[str, Any]:
    return run_step(services(), event, worker=current_worker(context)).model_dump(mode="json")
