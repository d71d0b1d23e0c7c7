"""WaitForLead: A sibling's gate rendezvous; its token is completed when its lead's reply begins. (thin handler: parse, one domain call, shape)."""

from aws_lambda_powertools.utilities.parser import event_parser

from laneflow.contracts import WaitForLeadRequest
from laneflow.gate import wait_for_lead
from laneflow.observability import lambda_handler
from laneflow.services import services


@lambda_handler
@event_parser(model=WaitForLeadRequest)
def handler(event: WaitForLeadRequest, context):
    return wait_for_lead(services(), event).model_dump(mode="json")
