"""WaitForLead: A sibling's gate rendezvous (its token is completed when its lead's reply begins), or a lead's wait for another run's writer of its prefix. (thin handler: parse, one domain call, shape)."""

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.domain.messages import WaitForLeadRequest
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.usecases.wait_for_lead import wait_at_gate
from laneflow.wiring import services


@lambda_handler
@event_parser(model=WaitForLeadRequest)
def handler(event: WaitForLeadRequest, context: LambdaContext) -> dict[str, Any]:
    return wait_at_gate(services(), event).model_dump(mode="json")
