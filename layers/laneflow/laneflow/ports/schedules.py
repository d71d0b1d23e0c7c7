"""The port of schedules' triggers: what fires a schedule where laneflow does not fire it
itself (in the cloud, an EventBridge Scheduler schedule; locally `serve` and `schedule
tick` fire from the store, and there is none)."""

from __future__ import annotations

from typing import Protocol

from laneflow.domain.schedules import Schedule


class ScheduleTriggers(Protocol):
    """Keeps one trigger per schedule, named by its tenant and id, in step with its record."""

    def put(self, schedule: Schedule) -> None:
        """Make the schedule's trigger (its expression, zone and state), or replace it."""

    def set_state(self, schedule: Schedule) -> None:
        """Enable or disable the trigger as the schedule's state says."""

    def delete(self, schedule: Schedule) -> None:
        """Remove the trigger (one already gone is no error)."""
