"""The API's routes for schedules: add one, list them, read one, pause, resume, remove. On
the same resolver as every route (`routes.app`), scoped to the caller's tenant like runs
(another tenant's schedule is answered exactly like a missing one, 404). The runs a
schedule started are `GET /runs?schedule=ID` (routes.py)."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel, ConfigDict, Field

from laneflow.domain.schedules import Firing, Overlap, ScheduleState
from laneflow.entrypoints.api.routes import Svc, Tenant, _errors, _json, app
from laneflow.usecases.schedules import AddSchedule, add_schedule, remove_schedule, set_state

ScheduleId = Annotated[str, Path(description="the schedule's id (sch-...)", min_length=1, max_length=64)]


class ScheduleShown(BaseModel):
    """A schedule as the API shows it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tenant: str
    workspace: str
    flow: str
    expression: str = Field(description="EventBridge's: rate(...), cron(...) or at(...)")
    timezone: str
    input: dict[str, Any]
    model: str | None
    overlap: Overlap
    state: ScheduleState
    created_at: str
    updated_at: str
    version: int
    last_run: str | None = Field(description="the run its latest started firing made")
    buffered: str | None = Field(description="the scheduled time of the firing held until last_run ends (buffer-one)")
    through: str | None = Field(description="every firing up to this time has been looked at (local serve)")
    firings: list[Firing] = Field(description="its latest firings, newest first: started, skipped, buffered, missed, failed")
    next: list[str] = Field(description="its next three firings, on its zone's clock (none while paused)")


class ScheduleList(BaseModel):
    schedules: list[ScheduleShown] = Field(description="the caller's schedules, oldest first")


def _location(schedule_id: str) -> str:
    here = (app.current_event.raw_event.get("requestContext") or {}).get("path") or app.current_event.path
    return f"{here.rstrip('/')}/{schedule_id}"


def _shown(model: type[BaseModel], status: int = 200) -> dict[int, OpenAPIResponse]:
    return {status: {"description": "the schedule", "content": {"application/json": {"model": model}}}}


@app.post(
    "/schedules",
    summary="Run a flow on a schedule (an EventBridge expression in a zone); everything is checked before it is kept",
    tags=["schedules"],
    responses={**_shown(ScheduleShown, 201), **_errors(400, 401, 404, 503)},
)
def add(body: Annotated[AddSchedule, Body()], tenant: Tenant, svc: Svc) -> Response[dict[str, Any]]:
    schedule = add_schedule(svc, tenant, body)
    return _json(201, schedule.public(), {"Location": _location(schedule.id)})


@app.get(
    "/schedules",
    summary="The caller's schedules, each with its next three firings",
    tags=["schedules"],
    responses={
        200: {"description": "the schedules", "content": {"application/json": {"model": ScheduleList}}},
        **_errors(400, 401),
    },
)
def list_schedules(tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return {"schedules": [s.public() for s in svc.store.list_schedules(tenant)]}


@app.get(
    "/schedules/<schedule_id>",
    summary="A schedule: its next firings and its latest firings (each run it started, each skipped or missed with why)",
    tags=["schedules"],
    responses={**_shown(ScheduleShown), **_errors(400, 401, 404)},
)
def get_schedule(schedule_id: ScheduleId, tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return svc.store.get_schedule(tenant, schedule_id).public()


@app.delete(
    "/schedules/<schedule_id>",
    summary="Remove a schedule: nothing fires it again (the runs it started stay)",
    tags=["schedules"],
    responses={**_shown(ScheduleShown), **_errors(400, 401, 404)},
)
def remove(schedule_id: ScheduleId, tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return remove_schedule(svc, tenant, schedule_id).public()


class NoFields(BaseModel):
    """Takes no fields: no body, an empty one, or `{}`."""

    model_config = ConfigDict(extra="forbid")


@app.post(
    "/schedules/<schedule_id>/pause",
    summary="Pause a schedule: nothing fires until it is resumed",
    tags=["schedules"],
    responses={**_shown(ScheduleShown), **_errors(400, 401, 404)},
)
def pause(schedule_id: ScheduleId, tenant: Tenant, svc: Svc, body: Annotated[NoFields | None, Body()] = None) -> dict[str, Any]:
    return set_state(svc, tenant, schedule_id, ScheduleState.paused).public()


@app.post(
    "/schedules/<schedule_id>/resume",
    summary="Resume a paused schedule: it fires from now on, not what came while it was paused",
    tags=["schedules"],
    responses={**_shown(ScheduleShown), **_errors(400, 401, 404)},
)
def resume(schedule_id: ScheduleId, tenant: Tenant, svc: Svc, body: Annotated[NoFields | None, Body()] = None) -> dict[str, Any]:
    return set_state(svc, tenant, schedule_id, ScheduleState.enabled).public()
