"""WaitForLead: a sibling's gate rendezvous; its token is completed when its lead's reply begins."""

from laneflow.contracts import WaitForLeadRequest
from laneflow.gate import wait_for_lead
from laneflow.services import services


def handler(event, context):
    return wait_for_lead(services(), WaitForLeadRequest.model_validate(event)).model_dump(mode="json")
