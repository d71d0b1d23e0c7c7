"""SettleGroup: what a finished group means for the run (next group, or end)."""

from laneflow.contracts import SettleGroupRequest
from laneflow.drive import settle_group
from laneflow.services import services


def handler(event, context):
    return settle_group(services(), SettleGroupRequest.model_validate(event)).model_dump(mode="json")
