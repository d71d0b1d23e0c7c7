"""Schedules: a flow run on an EventBridge schedule expression, and what each firing did.

A schedule names a workspace, a flow, an input, an expression and a zone
(laneflow.domain.schedule_expressions), and an overlap policy. Each firing is one
scheduled time; what it did is kept on the schedule (its latest FIRINGS_KEPT, newest
first): `started` (the run it made), `skipped` (why: the last run still active, paused),
`buffered` (held until the last run ends), `missed` (it came while nothing fired: a local
`serve` that was down) or `failed` (the run could not be made: why).

Exactly one run per firing: the run's id comes from (tenant, schedule, scheduled time)
through the idempotent start's key (`firing_key`), so a second delivery of the same firing
finds the run the first made and starts nothing.

Overlap (`overlap`), while the schedule's last run is still active (queued, running or
awaiting approval): `skip` (the default) records the firing skipped; `buffer-one` holds one
firing, started once that run ends (a second is skipped while one is held); `allow`
starts whatever runs.

Catch-up (`due`): of the firings that came since the schedule was last looked at, the
latest is fired if it is at most `catchup_s` old; the others (and that one, when older) are
recorded missed.
"""

from __future__ import annotations

import datetime as dt
import secrets
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from laneflow.domain import schedule_expressions as expressions
from laneflow.domain.errors import NotFound
from laneflow.domain.records import utcnow

FIRINGS_KEPT = 20  # the firings a schedule's record lists (newest first)

NEXT_SHOWN = 3  # the next firings `schedule list` and the API show

CATCHUP_S = 3600.0  # the oldest missed firing a local `serve` still fires when it comes back

MISSED_LOOKED_AT = FIRINGS_KEPT  # firings walked back over when recording missed ones: the record keeps no more

SCHEDULE_ID = "schedule_id"  # run.options: the schedule that started the run

SCHEDULED_AT = "scheduled_at"  # run.options: the firing's scheduled time (UTC)


class Overlap(StrEnum):
    skip = "skip"
    allow = "allow"
    buffer_one = "buffer-one"


class ScheduleState(StrEnum):
    enabled = "enabled"
    paused = "paused"


class Outcome(StrEnum):
    started = "started"
    skipped = "skipped"
    buffered = "buffered"
    missed = "missed"
    failed = "failed"


class ScheduleNotFound(NotFound):
    def __init__(self, schedule_id: str):
        super().__init__(f"no schedule {schedule_id!r}")
        self.schedule_id = schedule_id


class Firing(BaseModel):
    """What one scheduled time did."""

    model_config = ConfigDict(extra="ignore")

    scheduled_at: str = Field(description="the firing's scheduled time, UTC")
    outcome: Outcome
    run_id: str | None = Field(
        default=None, description="the run it started (started), or that was still active (skipped, buffered)"
    )
    reason: str | None = Field(default=None, description="why it was skipped, missed or failed to start")
    recorded_at: str = Field(default_factory=utcnow)


class Schedule(BaseModel):
    """A flow of a workspace run on a schedule, and its latest firings."""

    model_config = ConfigDict(extra="ignore")

    id: str
    tenant: str
    workspace: str = Field(description="the workspace's name")
    flow: str
    expression: str = Field(description="EventBridge's: rate(...), cron(...) or at(...)")
    timezone: str = "UTC"
    input: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    overlap: Overlap = Overlap.skip
    state: ScheduleState = ScheduleState.enabled
    created_at: str = Field(default_factory=utcnow)
    updated_at: str = Field(default_factory=utcnow)
    version: int = 1
    last_run: str | None = Field(default=None, description="the run its latest started firing made")
    buffered: str | None = Field(default=None, description="the scheduled time of the firing held until last_run ends")
    through: str | None = Field(default=None, description="every firing up to this time has been looked at (locally)")
    firings: list[Firing] = Field(default_factory=list, description=f"its latest {FIRINGS_KEPT} firings, newest first")
    # Where its workspace is (a folder here, an S3 URI in the cloud): kept, never shown.
    workspace_uri: str = ""

    @field_validator("firings")
    @classmethod
    def _bounded(cls, firings: list[Firing]) -> list[Firing]:
        return firings[:FIRINGS_KEPT]

    @property
    def parsed(self) -> expressions.Expression:
        return expressions.parse(self.expression)

    @property
    def zone(self) -> Any:
        return expressions.zone(self.timezone)

    @property
    def anchor(self) -> dt.datetime:
        """What a rate counts from: the schedule's creation."""
        return expressions.instant_of(self.created_at, "created_at")

    def next_firings(self, now: dt.datetime, count: int = NEXT_SHOWN) -> list[dt.datetime]:
        """Its next `count` firings after `now` (none while paused)."""
        if self.state != ScheduleState.enabled:
            return []
        return expressions.next_firings(self.parsed, self.zone, now, count, anchor=self.anchor)

    def public(self, now: dt.datetime | None = None) -> dict[str, Any]:
        """The schedule as the CLI's `--json` and the API show it: its fields (not where its
        workspace is) and `next`, its next firings on its zone's clock."""
        record = self.model_dump(mode="json", exclude={"workspace_uri"})
        zone = self.zone
        record["next"] = [expressions.local_text(at, zone) for at in self.next_firings(now or dt.datetime.now(dt.UTC))]
        return record

    def firing(self, scheduled_at: str) -> Firing | None:
        return next((f for f in self.firings if f.scheduled_at == scheduled_at), None)


def new_schedule_id() -> str:
    """`sch-` and 16 random hex digits."""
    return "sch-" + secrets.token_hex(8)


def firing_key(schedule_id: str, scheduled_at: str) -> str:
    """The idempotency key of a firing's run: the same (schedule, scheduled time) names the
    same run (`start_run_idempotent.idempotent_run_id` makes its id, per tenant)."""
    return f"schedule {schedule_id} at {scheduled_at}"


def scheduled_text(given: str) -> str:
    """A scheduled time as the records keep it: UTC, to the minute (Scheduler's precision),
    so each delivery of a firing names it the same way."""
    return expressions.utc_text(expressions.minute(expressions.instant_of(given)))


Decision = Literal["start", "skip", "buffer"]


def overlap(policy: Overlap, *, last_run_active: bool, buffered: str | None, scheduled_at: str) -> tuple[Decision, str | None]:
    """What a firing does under the schedule's overlap policy: (decision, why) - `start`, or
    `skip` or `buffer` with the reason recorded."""
    if not last_run_active or policy == Overlap.allow:
        return "start", None
    if policy == Overlap.buffer_one:
        if buffered is None or buffered == scheduled_at:
            return "buffer", "held until the schedule's last run ends (overlap: buffer-one)"
        return "skip", f"the schedule's last run is still active and the firing of {buffered} is already held (buffer-one)"
    return "skip", "the schedule's last run is still active (overlap: skip)"


def recorded(schedule: Schedule, firing: Firing, *, through: str | None = None) -> Schedule:
    """The schedule with `firing` recorded (pure). A firing already recorded stays as it
    was, unless it was held (buffered) or skipped and has now started; the schedule's last
    run is its latest started firing's; what it holds is let go once that firing starts;
    `through` only moves forward."""
    earlier = schedule.firing(firing.scheduled_at)
    firings = list(schedule.firings)
    if earlier is None:
        firings.append(firing)
    elif firing.outcome == Outcome.started and earlier.outcome != Outcome.started:
        firings[firings.index(earlier)] = firing
    firings.sort(key=lambda f: f.scheduled_at, reverse=True)
    changes: dict[str, Any] = {"firings": firings[:FIRINGS_KEPT], "version": schedule.version + 1, "updated_at": utcnow()}
    if firing.outcome == Outcome.started and (earlier is None or earlier.outcome != Outcome.started):
        latest = max((f for f in firings if f.outcome == Outcome.started), key=lambda f: f.scheduled_at)
        changes["last_run"] = latest.run_id
        if schedule.buffered == firing.scheduled_at:
            changes["buffered"] = None
    if firing.outcome == Outcome.buffered and schedule.buffered is None:
        changes["buffered"] = firing.scheduled_at
    if through is not None and (schedule.through is None or through > schedule.through):
        changes["through"] = through
    return schedule.model_copy(update=changes)


def with_state(schedule: Schedule, state: ScheduleState, now: dt.datetime) -> Schedule:
    """The schedule paused or resumed (pure). Resumed, it looks only at firings from now
    on: what came while it was paused did not fire and is not due."""
    changes: dict[str, Any] = {"state": state, "version": schedule.version + 1, "updated_at": utcnow()}
    if state == ScheduleState.enabled and schedule.state != ScheduleState.enabled:
        changes["through"] = expressions.utc_text(now)
    return schedule.model_copy(update=changes)


class Due(BaseModel):
    """What a look at a schedule at one time finds: the firing to fire (if any) and the
    firings it missed (newest first), and how far it has looked (`through`)."""

    fire: str | None = None
    missed: list[str] = Field(default_factory=list)
    through: str | None = None


def due(schedule: Schedule, now: dt.datetime, *, catchup_s: float = CATCHUP_S) -> Due:
    """The firings of an enabled schedule from just after what was looked at (`through`, or
    its creation) up to `now`: the latest fires if it is at most `catchup_s` old, the others
    are missed (at most MISSED_LOOKED_AT of them: the record keeps no more)."""
    if schedule.state != ScheduleState.enabled:
        return Due()
    since = expressions.instant_of(schedule.through or schedule.created_at, "through")
    came: list[dt.datetime] = []
    for at in expressions.last_firing(schedule.parsed, schedule.zone, now, anchor=schedule.anchor, since=since):
        came.append(at)
        if len(came) > MISSED_LOOKED_AT:
            break
    if not came:
        return Due()
    latest, *older = came
    fire = latest if (now - latest).total_seconds() <= catchup_s else None
    missed = ([] if fire else [latest]) + older
    return Due(
        fire=None if fire is None else expressions.utc_text(fire),
        missed=[expressions.utc_text(at) for at in missed],
        through=expressions.utc_text(latest),
    )


class FireScheduleRequest(BaseModel):
    """What EventBridge Scheduler delivers to the function that fires a schedule (the
    target's Input, `scheduled_at` filled from `<aws.scheduler.scheduled-time>`)."""

    model_config = ConfigDict(extra="ignore")

    tenant: str = Field(min_length=1, max_length=64)
    schedule_id: str = Field(min_length=1, max_length=64)
    scheduled_at: str = Field(min_length=1, max_length=40)


def check_new(schedule: Schedule, now: dt.datetime) -> None:
    """Everything about a new schedule that needs no workspace: its expression, its zone,
    and (for `at`) a time that exists and is to come. `ExpressionInvalid` naming the field."""
    parsed = expressions.parse(schedule.expression)
    zone = expressions.zone(schedule.timezone)
    expressions.check_at(parsed, zone, now)
