"""The on-end hook in the cloud: "run finished" sent to an EventBridge bus."""

from __future__ import annotations

import json
from typing import Any

from laneflow.domain.records import Run, finished_event


class EventBridgeOnEnd:
    """PutEvents of "run finished" on a bus (the cloud adapter)."""

    def __init__(self, bus: str, client: Any | None = None):
        self.bus = bus
        self._client = client

    def __call__(self, run: Run) -> None:
        if self._client is None:
            import boto3

            self._client = boto3.client("events")
        self._client.put_events(
            Entries=[{"Source": "laneflow", "DetailType": "run finished", "Detail": json.dumps(finished_event(run)), "EventBusName": self.bus}]
        )
