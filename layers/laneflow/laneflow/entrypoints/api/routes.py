"""The HTTP API: one Powertools resolver, the same routes behind API Gateway
(functions/api/app.py) and behind `laneflow serve` (entrypoints/serve.py).

Each route reads its request (the tenant always from the caller's identity: the Cognito
authorizer's `custom:tenant` claim, else the IAM caller's account id; neither is a 401,
and a name no tenant can have is a 400; another tenant's run is answered exactly like a
missing one, 404), calls one use case and shapes its answer. Errors are answered in one
place (`errors.py`). `/` is the run viewer: its page, and its modules, style and vendored
libraries at `/assets/NAME`, are the files of `viewer/` (`viewer_assets.py`). A path that
exists asked with another method is a 405 with `Allow`.
"""

from __future__ import annotations

import base64
import threading
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import (
    APIGatewayRestResolver,
    Response,
    content_types,
)
from aws_lambda_powertools.event_handler.depends import Depends
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.event_handler.request import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from laneflow import __version__
from laneflow.adapters.workers import current_worker
from laneflow.domain import jsonsafe
from laneflow.domain.errors import Unavailable
from laneflow.domain.records import Run
from laneflow.domain.tenants import check_tenant
from laneflow.entrypoints.api import document as document_of
from laneflow.entrypoints.api import errors, viewer_assets
from laneflow.entrypoints.api.errors import ErrorBody, Unauthenticated
from laneflow.ports import Services
from laneflow.usecases.approve import answer_approval
from laneflow.usecases.estimate import EstimateAnswer, EstimateRequest, estimate_request
from laneflow.usecases.list_runs import SHOWN_STATUSES, page_of_runs
from laneflow.usecases.redrive import redrive_run
from laneflow.usecases.schedules import runs_of_schedule
from laneflow.usecases.start_run_idempotent import StartRun, start_run_idempotent
from laneflow.usecases.stop import stop_run


def _read_body(text: str) -> Any:
    """Every body, read strictly (`laneflow.jsonsafe`). Text that is not JSON raises
    `json.JSONDecodeError`, which Powertools answers as its own 400; JSON laneflow does not
    take (NaN, Infinity, a lone surrogate, nesting or size past its bounds) is a 400 naming
    the field, like any body that does not fit its model."""
    try:
        return jsonsafe.parse(text)
    except jsonsafe.Refusal as refused:
        raise RequestValidationError([{"type": "json_refused", "loc": ("body", *refused.parts), "msg": refused.reason}]) from None


app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=_read_body)


# Powertools keeps the current event on the resolver (a class attribute), so one request is
# resolved at a time per process. A Lambda container handles one anyway; `laneflow serve`
# answers on many threads, and every route is a few store reads and writes.
_resolving = threading.Lock()


def resolve(event: dict[str, Any], context: Any, svc: Services) -> dict[str, Any]:
    """Answer one API Gateway REST proxy event with the routes below, over `svc`."""
    with _resolving:
        app.append_context(services=svc)  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated
        return app.resolve(_as_json(event), context)


def _as_json(event: dict[str, Any]) -> dict[str, Any]:
    """Every body this API takes is JSON, whatever its Content-Type says (`curl -d` sends
    JSON labelled as a form): read as a form, it would be refused with confusing errors.

    A base64 body (API Gateway's binary media types) is decoded here, strictly; one that is
    not base64 of UTF-8 text is passed on as it came, so reading it as JSON refuses it (a
    400), rather than failing inside the resolver (a 500)."""
    body = event.get("body")
    if event.get("isBase64Encoded"):
        if isinstance(body, str):
            try:
                body = base64.b64decode(body, validate=True).decode("utf-8")
            except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
                pass
        event = {**event, "body": body, "isBase64Encoded": False}
    headers = {k: v for k, v in (event.get("headers") or {}).items() if str(k).lower() != "content-type"}
    multi = {k: v for k, v in (event.get("multiValueHeaders") or {}).items() if str(k).lower() != "content-type"}
    return {
        **event,
        "headers": {**headers, "Content-Type": "application/json"},
        "multiValueHeaders": {**multi, "Content-Type": ["application/json"]},
    }


errors.install(app, lambda: app.context.get("services"))


# -- who is asking ------------------------------------------------------------------------------


def caller_tenant(request: Request) -> str:
    """The tenant of the caller: a Cognito user's `custom:tenant` claim, else the IAM
    caller's account id. Never read from the body."""
    context = request.resolved_event.raw_event.get("requestContext") or {}
    claims = (context.get("authorizer") or {}).get("claims") or {}
    tenant = claims.get("custom:tenant") or (context.get("identity") or {}).get("accountId")
    if not tenant or not isinstance(tenant, str):
        raise Unauthenticated("this request carries no identity to take a tenant from")
    return check_tenant(tenant, source="the caller's tenant")  # a 400 naming it, before any store key is built


def bound_services() -> Services:
    services: Services = app.context["services"]
    return services


Tenant = Annotated[str, Depends(caller_tenant)]

Svc = Annotated[Services, Depends(bound_services)]

RunId = Annotated[str, Path(description="the run's id", min_length=1, max_length=128)]


def _record(run: Run) -> dict[str, Any]:
    """The run as the API shows it: `Run.public()`, without `steps` when they were not read."""
    record = run.public()
    if not run.steps:
        record.pop("steps", None)
    return record


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers)


def _errors(*statuses: int) -> dict[int, OpenAPIResponse]:
    said = {
        401: "no identity to take a tenant from",
        404: "no such run (or workspace) for this tenant",
        409: "the run is not in a state that allows this, or an idempotency key was reused",
        400: "bad input: the request does not fit its model (every field named), or the flow or its input is not valid",
        503: "this deployment cannot do this",
    }
    return {s: {"description": said[s], "content": {"application/json": {"model": ErrorBody}}} for s in statuses}


# -- starting a run -----------------------------------------------------------------------------


def _run_location(run_id: str) -> str:
    # requestContext.path carries the stage in the cloud ("/Prod/runs"): the run is beside it.
    here = (app.current_event.raw_event.get("requestContext") or {}).get("path") or app.current_event.path
    return f"{here.rstrip('/')}/{run_id}"


@app.post(
    "/runs",
    summary="Start a run",
    tags=["runs"],
    responses={
        201: {"description": "the run, queued; a drive of it has started", "content": {"application/json": {"model": Run}}},
        200: {
            "description": "the run this idempotency_key started before (nothing new started)",
            "content": {"application/json": {"model": Run}},
        },
        **_errors(400, 401, 404, 409, 503),
    },
)
def start_run(body: Annotated[StartRun, Body()], tenant: Tenant, svc: Svc) -> Response[dict[str, Any]]:
    started = start_run_idempotent(svc, tenant, body)
    if started.replayed:
        return _json(200, _record(started.run), {"Location": _run_location(started.run.id), "Idempotent-Replayed": "true"})
    return _json(201, _record(started.run), {"Location": _run_location(started.run.id)})


# -- reading runs -------------------------------------------------------------------------------


class RunList(BaseModel):
    runs: list[Run] = Field(description="newest first, without their steps")
    next: str | None = Field(description="pass as `before` for the page after this one; null when no older run is left")
    searched: int = Field(description="how many runs were read for this page (a search reads at most 500)")


_SHOWN = "|".join(SHOWN_STATUSES)


@app.get(
    "/runs",
    summary="List runs, newest first, a page at a time; filtered by status and searched",
    tags=["runs"],
    responses={
        200: {"description": "the caller's runs", "content": {"application/json": {"model": RunList}}},
        **_errors(400, 401, 404),
    },
)
def list_runs(
    tenant: Tenant,
    svc: Svc,
    limit: Annotated[int, Query(ge=1, le=500, description="at most this many runs")] = 50,
    before: Annotated[
        str | None, Query(min_length=1, max_length=128, description="the page after this run (a page's `next`)")
    ] = None,
    status: Annotated[
        str,
        Query(
            max_length=200,
            pattern=rf"^(({_SHOWN})(,({_SHOWN}))*)?$",
            description="only runs of these statuses, comma-separated; `stopped` is a failed run a person stopped",
        ),
    ] = "",
    q: Annotated[
        str, Query(max_length=200, description="only runs whose id, workspace, flow, status or error holds every word")
    ] = "",
    schedule: Annotated[
        str | None, Query(min_length=1, max_length=64, description="only the runs this schedule's firings started, newest first")
    ] = None,
) -> dict[str, Any]:
    if schedule is not None:  # the schedule's own list (status and q are not applied to it)
        svc.store.get_schedule(tenant, schedule)  # another tenant's, or none: a 404
        of = runs_of_schedule(svc, tenant, schedule, limit=limit, before=before)
        return {"runs": [_record(run) for run in of.runs], "next": of.next, "searched": len(of.runs)}
    page = page_of_runs(svc, tenant, limit=limit, before=before, status=[s for s in status.split(",") if s], text=q)
    return {"runs": [_record(run) for run in page.runs], "next": page.next, "searched": page.searched}


@app.get(
    "/runs/<run_id>",
    summary="A run and its steps",
    tags=["runs"],
    responses={200: {"description": "the run record", "content": {"application/json": {"model": Run}}}, **_errors(400, 401, 404)},
)
def get_run(run_id: RunId, tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return svc.store.get_run(tenant, run_id).public()


# -- what people do to runs ---------------------------------------------------------------------


Reason = Annotated[
    str | None,
    Field(max_length=500, description="why, in a person's words: kept in the run's error (a stop, a rejection) and trace"),
]


class StopBody(BaseModel):
    """A stop, optionally with why (no body at all is a stop without a reason)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason = None


def _reason(text: str | None) -> str | None:
    """The reason on one line, as records say it; None for none, or only blanks."""
    return " ".join((text or "").split()) or None


class Stopped(BaseModel):
    message: str = Field(description="what the stop did: stopped, stop requested, already stopped, already ended")
    run: Run


@app.post(
    "/runs/<run_id>/stop",
    summary="Stop a run (one-way)",
    tags=["runs"],
    responses={
        200: {"description": "what the stop did", "content": {"application/json": {"model": Stopped}}},
        **_errors(400, 401, 404),
    },
)
def stop(run_id: RunId, tenant: Tenant, svc: Svc, body: Annotated[StopBody | None, Body()] = None) -> dict[str, Any]:
    outcome = stop_run(svc, tenant, run_id, reason=_reason(body.reason if body else None))
    return {"message": outcome.message, "run": _record(outcome.run)}


class Approval(BaseModel):
    """A person's answer to the approval a run is parked at."""

    model_config = ConfigDict(extra="forbid")

    approve: StrictBool = Field(description="true continues the run in a new drive; false fails it (rejected by a person)")
    reason: Reason = None


@app.post(
    "/runs/<run_id>/approval",
    summary="Answer the approval a run waits for",
    tags=["runs"],
    responses={
        200: {"description": "the run, queued (approved) or failed (rejected)", "content": {"application/json": {"model": Run}}},
        **_errors(400, 401, 404, 409, 503),
    },
)
def approval(run_id: RunId, body: Annotated[Approval, Body()], tenant: Tenant, svc: Svc) -> dict[str, Any]:
    if body.approve and svc.drives is None:
        raise Unavailable("this deployment cannot start drives")
    run = answer_approval(svc, tenant, run_id, approve=body.approve, reason=_reason(body.reason))
    if body.approve and svc.drives is not None:  # (not None when approving: checked above)
        svc.drives.start(tenant, run.id)
    return _record(run)


class Redrive(BaseModel):
    """A redrive takes no fields: no body, an empty one, or `{}`."""

    model_config = ConfigDict(extra="forbid")


@app.post(
    "/runs/<run_id>/redrive",
    summary="Redrive a failed run from where it failed: its failed and skipped steps run again, its completed steps are kept",
    tags=["runs"],
    responses={
        200: {
            "description": "the run record, as GET /runs/{run_id} answers it, queued for the new drive that has started"
            " (its `redrives` grown by one, its failed and skipped steps pending)",
            "content": {"application/json": {"model": Run}},
        },
        **_errors(400, 401, 404, 409, 503),
    },
)
def redrive(run_id: RunId, tenant: Tenant, svc: Svc, body: Annotated[Redrive | None, Body()] = None) -> dict[str, Any]:
    if svc.drives is None:
        raise Unavailable("this deployment cannot start drives")
    # Until the drive's first state takes it, the run is held by this request (a Lambda's, or
    # `laneflow serve`'s process), so no reconcile starts a second drive of it meanwhile.
    redrive_run(svc, tenant, run_id, driver=current_worker(app.lambda_context))
    svc.drives.start(tenant, run_id)
    return svc.store.get_run(tenant, run_id).public()


# -- estimating a run ---------------------------------------------------------------------------


@app.post(
    "/estimates",
    summary="Estimate a run before it runs: each lane's prefix, cache writes and reads with and without the gate, the cost range",
    tags=["runs"],
    responses={
        200: {
            "description": "the estimate (nothing is written, nothing runs)",
            "content": {"application/json": {"model": EstimateAnswer}},
        },
        **_errors(400, 401, 404, 503),
    },
)
def estimate(body: Annotated[EstimateRequest, Body()], tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return estimate_request(svc, tenant, body)


# -- the document and the viewer ----------------------------------------------------------------


@app.get("/openapi.json", summary="This API's OpenAPI document", tags=["meta"])
def openapi() -> Response[str]:
    event = app.current_event.raw_event
    base = viewer_assets.base_of(event)
    raw = app.get_openapi_json_schema(title="laneflow", version=__version__, description=__doc__.split("\n\n")[0])
    document = document_of.shape(raw, server=document_of.server_url(event, base))
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=document)


@app.get(
    "/",
    summary="The run viewer (an HTML page)",
    tags=["meta"],
    responses={200: {"description": "the viewer page", "content": {"text/html": {}}}},
)
def viewer(svc: Svc) -> Response[str]:
    # Everything a run holds is put in the page as text by its modules (never as HTML), and
    # the policy allows only this origin's scripts and styles, so nothing a run holds can run.
    event = app.current_event.raw_event
    page, policy = viewer_assets.page(viewer_assets.base_of(event), viewer_assets.sign_in(event, svc.settings))
    headers = {"Content-Security-Policy": policy, "Cache-Control": "no-store", **viewer_assets.SECURITY_HEADERS}
    return Response(status_code=200, content_type="text/html; charset=utf-8", body=page, headers=headers)


AssetName = Annotated[str, Path(description="an asset's file name", min_length=1, max_length=100)]


@app.get(
    "/assets/<name>",
    summary="One of the viewer's files (its modules, style and vendored libraries)",
    tags=["meta"],
    responses={200: {"description": "the file", "content": {"text/javascript": {}, "text/css": {}}}, **_errors(400, 404)},
)
def viewer_asset(name: AssetName) -> Response[str]:
    found = viewer_assets.asset(name)
    headers = {"Cache-Control": "no-cache", **viewer_assets.SECURITY_HEADERS}
    return Response(status_code=200, content_type=found.content_type, body=found.text, headers=headers)


# -- a path that exists, asked with another method: 405 -----------------------------------------


@app.not_found
def not_found(_: Exception) -> Response[dict[str, Any]]:
    """No route for this method and path: a 405 naming the methods the path answers (in
    `Allow`), or a 404 when no route has this path."""
    event = app.current_event
    path = errors.scrub(event.path, app.context.get("services"))  # said back: no secret, no local path
    allowed = sorted({route.method for route in app._static_routes + app._dynamic_routes if route.rule.match(event.path)})
    if not allowed:
        return errors.error_response(404, f"no route {path[:100]!r} here (see /openapi.json)")
    response = errors.error_response(405, f"{event.http_method[:20]} is not answered on {path[:100]!r}: use {', '.join(allowed)}")
    response.headers["Allow"] = ", ".join(allowed)
    return response


# Routes kept in modules of their own, on this resolver.
from laneflow.entrypoints.api import questions as _questions  # noqa: E402,F401
from laneflow.entrypoints.api import schedules as _schedules  # noqa: E402,F401
