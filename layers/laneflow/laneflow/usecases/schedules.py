"""A person's actions on schedules: add one, list them, look at one, pause, resume, remove;
and the runs a schedule started, a page at a time.

Adding checks everything before anything is stored: the expression and the zone
(laneflow.domain.schedule_expressions), the workspace, the flow and the input (as a run of
them would be checked, `start_run.prepare_run`, nothing written). Each problem names its
field (`expression`, `timezone`, `flow`, `input`). Where the deployment fires schedules
through triggers of its own (`svc.triggers`: EventBridge Scheduler in the cloud), the
trigger is made, paused, resumed and removed with the record; where a trigger cannot be
made, the record is taken back, so nothing is left half-made. Locally there are none:
`serve` and `schedule tick` fire from the store (usecases.fire_schedule)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from laneflow.domain.errors import InvalidInput, ModelNotConfigured, NotFound, Problem, RunInputInvalid, Unavailable
from laneflow.domain.records import Run, utcnow
from laneflow.domain.schedules import (
    Overlap,
    Schedule,
    ScheduleState,
    check_new,
    new_schedule_id,
)
from laneflow.ports import Services
from laneflow.usecases.start_run import prepare_run


class ScheduleInvalid(InvalidInput):
    """A schedule's flow, input or model that a run could not start with: its first problem
    names the field (and is its message), the others are the run's own problems."""

    def __str__(self) -> str:
        return "\n".join([str(self.args[0]), *(f"  {p}" for p in self.problems[1:])])


class AddSchedule(BaseModel):
    """A flow of a workspace, run on an EventBridge schedule expression in a zone."""

    model_config = ConfigDict(extra="forbid")

    workspace: str = Field(min_length=1, max_length=200, description="the workspace's name")
    flow: str = Field(min_length=1, max_length=200, description="the flow's name (flows/<flow>.yaml)")
    expression: str = Field(
        min_length=1,
        max_length=256,
        description="EventBridge's: rate(15 minutes), cron(0 7 ? * MON-FRI *) (six fields, one of the days '?'),"
        " at(2026-12-24T06:00:00)",
    )
    input: dict[str, Any] = Field(
        default_factory=dict, description="each run's input, checked against the flow's `input:` schema"
    )
    timezone: str = Field(default="UTC", min_length=1, max_length=64, description="the IANA zone the expression is read in")
    overlap: Overlap = Field(
        default=Overlap.skip,
        description="while its last run is active: skip the firing (default), buffer-one (start one after it), allow",
    )
    model: str | None = Field(default=None, min_length=1, max_length=200, description="run every step on this model")


def _field_of(error: InvalidInput) -> str:
    if isinstance(error, RunInputInvalid) or str(error.args[0] if error.args else "").startswith("input"):
        return "input"
    return "model" if isinstance(error, ModelNotConfigured) else "flow"


def add_schedule(
    svc: Services, tenant: str, request: AddSchedule, *, where: str | None = None, now: dt.datetime | None = None
) -> Schedule:
    """Check and store a new schedule of the tenant's, made at `now` (its firings are those
    after it); make its trigger where the deployment has them. `where` is the workspace's location when the caller gives it (the CLI's
    folder); else the workspace is found by name (`svc.workspaces`). Raises
    `ExpressionInvalid` (`expression`, `timezone`), `InvalidInput` naming `flow`, `input`
    or `model`, `WorkspaceNotFound`."""
    now = now or dt.datetime.now(dt.UTC)
    schedule = Schedule(
        id=new_schedule_id(),
        tenant=tenant,
        workspace=request.workspace,
        flow=request.flow,
        expression=request.expression.strip(),
        timezone=request.timezone,
        input=request.input,
        model=request.model,
        overlap=request.overlap,
        created_at=now.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )
    check_new(schedule, now)
    uri = where or _locate(svc, tenant, request.workspace)
    try:
        run = prepare_run(svc, svc.folders.open(uri), request.flow, request.input, tenant=tenant, model=request.model)
    except InvalidInput as error:
        field = _field_of(error)
        said = str(error.args[0]) if error.args else type(error).__name__
        raise ScheduleInvalid(
            f"{field}: {said}", [Problem(file="schedule", field=field, message=said), *error.problems]
        ) from None
    schedule = schedule.model_copy(update={"workspace": run.workspace, "workspace_uri": uri})
    svc.store.create_schedule(schedule)
    if svc.triggers is not None:
        try:
            svc.triggers.put(schedule)
        except BaseException:
            svc.store.delete_schedule(tenant, schedule.id)  # no record without its trigger
            raise
    return svc.store.get_schedule(tenant, schedule.id)


def _locate(svc: Services, tenant: str, name: str) -> str:
    if svc.workspaces is None:
        raise Unavailable("this deployment has no workspaces to run schedules from")
    return svc.workspaces.locate(tenant, name)


def set_state(svc: Services, tenant: str, schedule_id: str, state: ScheduleState) -> Schedule:
    """Pause or resume a schedule (its trigger too). Resumed, what came while it was paused
    is not fired: it fires from now on."""
    before = svc.store.get_schedule(tenant, schedule_id)
    changed = svc.store.set_schedule_state(tenant, schedule_id, state, at=utcnow())
    if svc.triggers is not None and before.state != state:
        try:
            svc.triggers.set_state(changed)
        except BaseException:
            svc.store.set_schedule_state(tenant, schedule_id, before.state, at=utcnow())
            raise
    return changed


def remove_schedule(svc: Services, tenant: str, schedule_id: str) -> Schedule:
    """Remove a schedule and its trigger: nothing fires it again. The runs it started stay."""
    schedule = svc.store.get_schedule(tenant, schedule_id)
    if svc.triggers is not None:
        svc.triggers.delete(schedule)
    return svc.store.delete_schedule(tenant, schedule_id)


@dataclass(frozen=True)
class RunsOfSchedule:
    """A page of the runs a schedule started, newest firing first; `next` the run to pass
    as `before` for the page after it (None: no older one)."""

    runs: list[Run]
    next: str | None


def runs_of_schedule(
    svc: Services, tenant: str, schedule_id: str, *, limit: int = 50, before: str | None = None
) -> RunsOfSchedule:
    """The runs the schedule's firings started, a page at a time; `before` is a run of the
    schedule's (a page's `next`). `NotFound` when `before` is not one of its runs."""
    after: str | None = None
    if before is not None:
        run = svc.store.get_run(tenant, before, steps=False, detail=False)
        if run.schedule_id != schedule_id or run.scheduled_at is None:
            raise NotFound(f"run {before!r} was not started by schedule {schedule_id!r}")
        after = run.scheduled_at
    found = svc.store.list_schedule_runs(tenant, schedule_id, limit=limit + 1, before=after)
    runs = [run for _, run in found[:limit]]
    return RunsOfSchedule(runs=runs, next=runs[-1].id if len(found) > limit and runs else None)


def shown(schedules: list[Schedule], now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> list[dict[str, Any]]:
    """The schedules as the CLI's `--json` and the API list them (each with its next firings)."""
    at = now()
    return [s.public(at) for s in schedules]
