"""The HTTP API (README, "The HTTP API"; docs/INPUTS.md): one Powertools resolver, the same routes behind API
Gateway (functions/api/app.py) and behind `laneflow serve` (laneflow/serve.py).

- The tenant always comes from the caller's identity, never from a body: the Cognito
  authorizer's `custom:tenant` claim, else the IAM caller's account id; neither is a 401,
  and a name no tenant can have (`#`, `/`, a control character, empty, too long) is a 400.
  Another tenant's run is answered exactly like a missing one (404).
- Errors are types, mapped to status codes here and only here (the `exception_handler`s
  below): a `LaneflowError` answers its `http_status` (an `InvalidInput` lists its
  problems); a request that does not fit its model is a 400 naming the fields; anything
  else is a 500 with a generic message (the details go to the log, never to the caller).
- Starting a run with an `idempotency_key` derives the run id from (tenant, key), so a
  repeated start finds the run it made instead of making another, and starts no second
  drive. The request it was made from is kept as a fingerprint on the run: the same key
  with a different request is a 409.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import (
    APIGatewayRestResolver,
    Response,
    content_types,
)
from aws_lambda_powertools.event_handler.depends import Depends
from aws_lambda_powertools.event_handler.exceptions import ServiceError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.event_handler.request import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from laneflow import __version__
from laneflow.adapters.aws.s3 import ATTEMPTS, CACHE, local_path
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain import jsonsafe
from laneflow.domain.errors import (
    Conflict,
    InvalidInput,
    LaneflowError,
    Problem,
    RunNotFound,
)
from laneflow.domain.records import Run
from laneflow.domain.redaction import scrub_paths
from laneflow.domain.tenants import check_tenant
from laneflow.ports import Services
from laneflow.usecases.approve import answer_approval
from laneflow.usecases.start_run import prepare_run
from laneflow.usecases.stop import stop_run

log = logging.getLogger("laneflow.api")



def _read_body(text: str) -> Any:
    """Every body, read strictly (`laneflow.jsonsafe`). Text that is not JSON raises
    `json.JSONDecodeError`, which Powertools answers as its own 400; JSON laneflow does not
    take (NaN, Infinity, a lone surrogate, nesting or size past its bounds) is a 400 naming
    the field, like any body that does not fit its model."""
    try:
        return jsonsafe.parse(text)
    except jsonsafe.Refusal as refused:
        raise RequestValidationError(
            [{"type": "json_refused", "loc": ("body", *refused.parts), "msg": refused.reason}]
        ) from None



app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=_read_body)


# Powertools keeps the current event on the resolver (a class attribute), so one request is
# resolved at a time per process. A Lambda container handles one anyway; `laneflow serve`
# answers on many threads, and every route is a few store reads and writes.
_resolving = threading.Lock()


GENERIC_ERROR = "something went wrong on our side; it has been logged"

IDEMPOTENT_PREFIX = "run-k-"



def resolve(event: dict[str, Any], context: Any, svc: Services) -> dict[str, Any]:
    """Answer one API Gateway REST proxy event with the routes below, over `svc`."""
    with _resolving:
        app.append_context(services=svc)
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
    return {**event, "headers": {**headers, "Content-Type": "application/json"}, "multiValueHeaders": {**multi, "Content-Type": ["application/json"]}}



# -- errors ------------------------------------------------------------------------------------


class Unauthenticated(LaneflowError):
    """The request carries no identity laneflow can take a tenant from."""

    http_status = 401



class Unavailable(LaneflowError):
    """This deployment lacks what the request needs (a drive starter, a workspace source)."""

    http_status = 503



class IdempotencyKeyReused(Conflict):
    """An idempotency key was presented again with a different request."""



class ErrorBody(BaseModel):
    """Every error the API answers: one line, and what is wrong field by field when known."""

    message: str
    problems: list[dict[str, Any]] = Field(default_factory=list)



def _error(status: int, message: str, problems: list[dict[str, Any]] | None = None) -> Response:
    body = ErrorBody(message=message, problems=problems or [])
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body.model_dump())



def _scrub(text: str) -> str:
    """What a caller may read: no local paths (a workspace folder becomes its name), no
    secret (a bad input may quote a secret's value back)."""
    svc = app.context.get("services")
    roots = [str(CACHE), str(ATTEMPTS)]
    if svc is not None and isinstance(svc.workspaces, FolderWorkspaces):
        roots.append(str(svc.workspaces.root))
    text = scrub_paths(text, *roots)
    return svc.redactor(text) if svc is not None else text



@app.exception_handler(LaneflowError)
def _domain_error(exc: LaneflowError) -> Response:
    if exc.http_status == 500:  # not said on purpose: its message is not for the caller
        log.error("request failed: %s", type(exc).__name__, exc_info=exc)
        return _error(exc.http_status, GENERIC_ERROR)
    message = _scrub(str(exc.args[0]) if exc.args else type(exc).__name__)
    problems: list[Problem] = exc.problems if isinstance(exc, InvalidInput) else []
    return _error(
        exc.http_status,
        message,
        [p.model_copy(update={"message": _scrub(p.message)}).model_dump(exclude_none=True) for p in problems],
    )



@app.exception_handler(RequestValidationError)
def _request_invalid(exc: RequestValidationError) -> Response:
    # Only where and what: never the input itself or pydantic's internals.
    problems = []
    for e in exc.errors():
        loc = [str(part) for part in e.get("loc", ())] or ["body"]
        where, field = loc[0], ".".join(loc[1:])[:100]
        if e.get("type") == "json_invalid":
            field = ""  # its "field" is a character position
        problems.append({"in": where, "field": field or None, "message": e.get("msg", "invalid")})
    named = ", ".join(sorted({p["field"] or p["in"] for p in problems}))
    return _error(400, f"the request does not fit: {named}", problems)



@app.exception_handler(ServiceError)
def _service_error(exc: ServiceError) -> Response:
    # Powertools' own (a route that does not exist is a NotFoundError).
    return _error(exc.status_code, exc.msg)



@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Response:
    log.error("request failed unexpectedly: %s", type(exc).__name__, exc_info=exc)
    return _error(500, GENERIC_ERROR)



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
    return app.context["services"]



Tenant = Annotated[str, Depends(caller_tenant)]

Svc = Annotated[Services, Depends(bound_services)]

RunId = Annotated[str, Path(description="the run's id", min_length=1, max_length=128)]



def _record(run: Run) -> dict[str, Any]:
    """The run as the API shows it: `Run.public()`, without `steps` when they were not read."""
    record = run.public()
    if not run.steps:
        record.pop("steps", None)
    return record



def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers)



def _errors(*statuses: int) -> dict[int, dict[str, Any]]:
    said = {
        401: "no identity to take a tenant from",
        404: "no such run (or workspace) for this tenant",
        409: "the run is not in a state that allows this, or an idempotency key was reused",
        400: "bad input: the request does not fit its model (every field named), or the flow or its input is not valid",
        503: "this deployment cannot do this",
    }
    return {s: {"description": said[s], "content": {"application/json": {"model": ErrorBody}}} for s in statuses}



# -- starting a run -----------------------------------------------------------------------------


class StartRun(BaseModel):
    """Start a run of a flow of a workspace on an input."""

    model_config = ConfigDict(extra="forbid")

    workspace: str = Field(min_length=1, max_length=200, description="the workspace's name")
    flow: str = Field(min_length=1, max_length=200, description="the flow's name (flows/<flow>.yaml)")
    input: dict[str, Any] = Field(default_factory=dict, description="the run's input, checked against the flow's `input:` schema")
    model: str | None = Field(default=None, min_length=1, max_length=200, description="run every step on this model")
    idempotency_key: str | None = Field(
        default=None, min_length=1, max_length=255, description="the same key again returns the run it started (200) and starts nothing"
    )

    def fingerprint(self) -> str:
        """What the request asks for (everything but the key), to tell a retry from a reuse."""
        asked = self.model_dump(mode="json", exclude={"idempotency_key"})
        return "sha256:" + hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()



def idempotent_run_id(tenant: str, key: str) -> str:
    """The run id a (tenant, idempotency key) pair names; one tenant's key never names another's run."""
    return IDEMPOTENT_PREFIX + hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()[:24]



def _run_location(run_id: str) -> str:
    # requestContext.path carries the stage in the cloud ("/Prod/runs"): the run is beside it.
    here = (app.current_event.raw_event.get("requestContext") or {}).get("path") or app.current_event.path
    return f"{here.rstrip('/')}/{run_id}"



def _replayed(svc: Services, tenant: str, run_id: str, request: StartRun) -> Response | None:
    """The run an idempotency key already started (200), or None if it started none."""
    try:
        run = svc.store.get_run(tenant, run_id, detail=False)
    except RunNotFound:
        return None
    if run.options.get("idempotency_request") != request.fingerprint():
        raise IdempotencyKeyReused("this idempotency_key was used to start a different run; use a new key")
    return _json(200, _record(run), {"Location": _run_location(run.id), "Idempotent-Replayed": "true"})



@app.post(
    "/runs",
    summary="Start a run",
    tags=["runs"],
    responses={
        201: {"description": "the run, queued; a drive of it has started", "content": {"application/json": {"model": Run}}},
        200: {"description": "the run this idempotency_key started before (nothing new started)", "content": {"application/json": {"model": Run}}},
        **_errors(400, 401, 404, 409, 503),
    },
)
def start_run(body: Annotated[StartRun, Body()], tenant: Tenant, svc: Svc) -> Response[dict[str, Any]]:
    if svc.drives is None:
        raise Unavailable("this deployment cannot start drives")
    if svc.workspaces is None:
        raise Unavailable("this deployment has no workspaces to start runs from")
    run_id = idempotent_run_id(tenant, body.idempotency_key) if body.idempotency_key else None
    if run_id and (replay := _replayed(svc, tenant, run_id, body)):
        return replay
    uri = svc.workspaces.locate(tenant, body.workspace)  # the caller's own workspace, never another tenant's
    run = prepare_run(svc, local_path(uri), body.flow, body.input, tenant=tenant, model=body.model)
    run.workspace_uri = uri  # where every later reader finds it (an S3 URI in the cloud)
    if run_id:
        run.id = run_id
        run.options["idempotency_request"] = body.fingerprint()
    try:
        svc.store.create_run(run)
    except Conflict:
        # The same key, at the same moment, from a second request: it made the run.
        if run_id and (replay := _replayed(svc, tenant, run_id, body)):
            return replay
        raise
    svc.drives.start(tenant, run.id)
    return _json(201, _record(run), {"Location": _run_location(run.id)})



# -- reading runs -------------------------------------------------------------------------------


class RunList(BaseModel):
    runs: list[Run] = Field(description="newest first, without their steps")



@app.get(
    "/runs",
    summary="List runs, newest first",
    tags=["runs"],
    responses={200: {"description": "the caller's runs", "content": {"application/json": {"model": RunList}}}, **_errors(400, 401)},
)
def list_runs(
    tenant: Tenant,
    svc: Svc,
    limit: Annotated[int, Query(ge=1, le=500, description="at most this many runs")] = 50,
) -> dict[str, Any]:
    return {"runs": [_record(run) for run in svc.store.list_runs(tenant, limit=limit)]}



@app.get(
    "/runs/<run_id>",
    summary="A run and its steps",
    tags=["runs"],
    responses={200: {"description": "the run record", "content": {"application/json": {"model": Run}}}, **_errors(400, 401, 404)},
)
def get_run(run_id: RunId, tenant: Tenant, svc: Svc) -> dict[str, Any]:
    return svc.store.get_run(tenant, run_id).public()



# -- what people do to runs ---------------------------------------------------------------------


class Stopped(BaseModel):
    message: str = Field(description="what the stop did: stopped, stop requested, already stopped, already ended")
    run: Run



@app.post(
    "/runs/<run_id>/stop",
    summary="Stop a run (one-way)",
    tags=["runs"],
    responses={200: {"description": "what the stop did", "content": {"application/json": {"model": Stopped}}}, **_errors(400, 401, 404)},
)
def stop(run_id: RunId, tenant: Tenant, svc: Svc) -> dict[str, Any]:
    outcome = stop_run(svc, tenant, run_id)
    return {"message": outcome.message, "run": _record(outcome.run)}



class Approval(BaseModel):
    """A person's answer to the approval a run is parked at."""

    model_config = ConfigDict(extra="forbid")

    approve: StrictBool = Field(description="true continues the run in a new drive; false fails it (rejected by a person)")



@app.post(
    "/runs/<run_id>/approval",
    summary="Answer the approval a run waits for",
    tags=["runs"],
    responses={200: {"description": "the run, queued (approved) or failed (rejected)", "content": {"application/json": {"model": Run}}}, **_errors(400, 401, 404, 409, 503)},
)
def approval(run_id: RunId, body: Annotated[Approval, Body()], tenant: Tenant, svc: Svc) -> dict[str, Any]:
    if body.approve and svc.drives is None:
        raise Unavailable("this deployment cannot start drives")
    run = answer_approval(svc, tenant, run_id, approve=body.approve)
    if body.approve:
        svc.drives.start(tenant, run.id)  # type: ignore[union-attr] - checked above
    return _record(run)



# -- the document and the viewer ----------------------------------------------------------------


@app.get("/openapi.json", summary="This API's OpenAPI document", tags=["meta"])
def openapi() -> Response[str]:
    document = app.get_openapi_json_schema(title="laneflow", version=__version__, description=__doc__.split("\n\n")[0])
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=document)



@app.get("/", summary="The run viewer (an HTML page)", tags=["meta"], responses={200: {"description": "text/html"}})
def viewer() -> Response[str]:
    return Response(
        status_code=200,
        content_type="text/html; charset=utf-8",
        body=VIEWER_PAGE,
        headers={"Content-Security-Policy": VIEWER_POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
    )



# The viewer: one self-contained page. Everything it shows is put in with textContent (never
# as HTML), and its policy allows only its own script and style (by hash) and calls to this
# API, so nothing a run holds can run in the page.
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{display:flex;gap:1em;align-items:center;padding:.6em 1em;background:#1d232a;color:#fff}
header h1{font-size:1.1em;margin:0}header .grow{flex:1}
header input{width:16em}
main{display:grid;grid-template-columns:minmax(18em,28em) 1fr;gap:1em;padding:1em}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:.6em;overflow:auto}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.25em .4em;border-bottom:1px solid #eef0f2;vertical-align:top}
tr.run{cursor:pointer}tr.run:hover,tr.run.on{background:#eef4ff}
.s{font-weight:600}.completed{color:#1a7f37}.failed{color:#cf222e}.running{color:#0969da}
.awaiting-approval,.queued,.pending{color:#9a6700}.skipped{color:#6e7781}
.muted{color:#6e7781}.err{color:#cf222e}
pre{white-space:pre-wrap;margin:.2em 0;max-height:14em;overflow:auto;background:#f6f8fa;padding:.3em}
ul{margin:0;padding-left:1.1em}
"""


_SCRIPT = """
"use strict";
const base = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
const $ = (id) => document.getElementById(id);
let shown = null, timer = null;

function el(tag, opts, ...kids) {
  const e = document.createElement(tag);
  if (opts && opts.cls) e.className = opts.cls;
  if (opts && opts.title) e.title = opts.title;
  if (opts && opts.onclick) e.addEventListener("click", opts.onclick);
  for (const k of kids) e.append(k instanceof Node ? k : String(k == null ? "" : k));
  return e;
}
const usd = (x) => "$" + Number(x || 0).toFixed(4);
const status = (s) => el("span", {cls: "s " + s}, s);
const short = (v) => v == null ? "" : (typeof v === "string" ? v : JSON.stringify(v));

async function get(path) {
  const token = sessionStorage.getItem("laneflow-token");
  const r = await fetch(base + path, {headers: token ? {Authorization: token} : {}});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.message || ("HTTP " + r.status));
  return body;
}

function table(head, rows) {
  return el("table", null, el("thead", null, el("tr", null, ...head.map((h) => el("th", null, h)))),
            el("tbody", null, ...rows));
}

async function listRuns() {
  const out = $("runs");
  try {
    const {runs} = await get("runs?limit=100");
    out.replaceChildren(runs.length ? table(["run", "flow", "status", "cost"], runs.map((r) => {
      const tr = el("tr", {cls: "run" + (r.id === shown ? " on" : ""), onclick: () => { location.hash = encodeURIComponent(r.id); }},
        el("td", {title: r.created_at}, r.id), el("td", null, r.workspace + " / " + r.flow), el("td", null, status(r.status)),
        el("td", null, usd(r.cost_usd)));
      return tr;
    })) : el("p", {cls: "muted"}, "No runs yet."));
  } catch (e) { out.replaceChildren(el("p", {cls: "err"}, "Cannot list runs: " + e.message)); }
}

function layers(step) {
  return el("ul", null, ...(step.prompt_layers || []).map((l) =>
    el("li", {title: "sha256 " + l.sha256}, l.name + ": " + l.chars + " chars" + (l.dynamic ? " (dynamic)" : ""))));
}

function details(step) {
  const d = el("details", null, el("summary", null, (step.events || []).length + " events, " + (step.calls || []).length + " model calls"));
  if (step.result) d.append(el("pre", null, step.result));
  if (step.error) d.append(el("pre", {cls: "err"}, step.error));
  d.append(el("ul", null, ...(step.events || []).map((e) => el("li", null, el("span", {cls: "muted"}, e.t + " "), e.text))));
  d.append(el("ul", null, ...(step.calls || []).map((c) => el("li", null,
    "call " + c.n + ": " + c.model + ", " + c.ms + " ms, tokens in " + c.tokens.input + " / out " + c.tokens.output +
    " / cache read " + c.tokens.cache_read + " / cache write " + c.tokens.cache_write + ", " + usd(c.cost_usd)))));
  return d;
}

async function showRun(id) {
  shown = id; clearTimeout(timer);
  const out = $("run");
  if (!id) { out.replaceChildren(el("p", {cls: "muted"}, "Choose a run.")); return; }
  try {
    const run = await get("runs/" + encodeURIComponent(id));
    out.replaceChildren(
      el("h2", null, run.id, " ", status(run.status)),
      el("p", null, run.workspace + " / " + run.flow + " — " + usd(run.cost_usd) + ", " + run.drives + " drive(s), created " +
        run.created_at + (run.finished_at ? ", finished " + run.finished_at : "")),
      run.error ? el("p", {cls: "err"}, run.error) : "",
      el("pre", null, "input: " + JSON.stringify(run.input)),
      table(["#", "group", "agent", "item", "model", "status", "attempts", "cost", "prompt layers", "trace"], run.steps.map((s) =>
        el("tr", null, el("td", null, s.index), el("td", null, s.group), el("td", null, s.agent == null ? "(approval)" : s.agent),
          el("td", null, short(s.item)), el("td", null, s.model), el("td", null, status(s.status), s.skip_reason ? el("div", {cls: "muted"}, s.skip_reason) : ""),
          el("td", null, s.attempts), el("td", null, usd(s.cost_usd)), el("td", null, layers(s)), el("td", null, details(s)))))
    );
    if (!["completed", "failed"].includes(run.status)) timer = setTimeout(() => showRun(id), 3000);
  } catch (e) { out.replaceChildren(el("p", {cls: "err"}, "Cannot show " + id + ": " + e.message)); }
  listRuns();
}

function route() { showRun(decodeURIComponent(location.hash.slice(1))); }
$("token").value = sessionStorage.getItem("laneflow-token") || "";
$("token").addEventListener("change", (e) => { sessionStorage.setItem("laneflow-token", e.target.value.trim()); route(); });
$("refresh").addEventListener("click", route);
window.addEventListener("hashchange", route);
route();
"""



def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"



VIEWER_POLICY = (
    f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


VIEWER_PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>laneflow runs</title>
<style>{_STYLE}</style>
</head>
<body>
<header><h1>laneflow runs</h1><span class="grow"></span>
<label>token <input id="token" type="password" placeholder="Authorization header (cloud)" autocomplete="off"></label>
<button id="refresh" type="button">Refresh</button></header>
<main><section id="runs"><p class="muted">Loading…</p></section><section id="run"></section></main>
<script>{_SCRIPT}</script>
</body>
</html>
"""
