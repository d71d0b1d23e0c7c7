"""NextGroup: plan what the drive does next (run a group's lanes, or end)."""

from laneflow.contracts import NextGroupRequest
from laneflow.drive import next_group
from laneflow.services import services


def handler(event, context):
    return next_group(services(), NextGroupRequest.model_validate(event)).model_dump(mode="json")
