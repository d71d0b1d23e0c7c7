"""The on-end hook in the cloud: "run finished" sent to an EventBridge bus."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from laneflow.adapters.aws.clients import LazyClient
from laneflow.domain.records import Run, finished_event

if TYPE_CHECKING:
    from types_boto3_events import EventBridgeClient


class EventBridgeOnEnd(LazyClient["EventBridgeClient"]):
    """PutEvents of "run finished" on a bus (the cloud adapter)."""

    service = "events"

    def __init__(self, bus: str, client: EventBridgeClient | None = None):
        super().__init__(client)
        self.bus = bus

    def __call__(self, run: Run) -> None:
        self.client.put_events(
            Entries=[
                {
                    "Source": "laneflow",
                    "DetailType": "run finished",
                    "Detail": json.dumps(finished_event(run)),
                    "EventBusName": self.bus,
                }
            ]
        )
