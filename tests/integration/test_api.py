"""The HTTP API (laneflow/api.py): through API Gateway-shaped events, as the Lambda handler
receives them, and through `laneflow serve` over real HTTP on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.parser.models import APIGatewayProxyEventModel
from helpers import EXAMPLES, FIXTURES, ROOT

from laneflow.adapters.engine.local import LocalEngine
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.errors import InvalidInput
from laneflow.domain.records import RunChanges, RunStatus, StepStatus
from laneflow.entrypoints.api import GENERIC_ERROR, app, idempotent_run_id, resolve
from laneflow.entrypoints.serve import make_server
from laneflow.ports import Services
from laneflow.usecases.start_run import prepare_run
from laneflow.wiring import install, local_engine

EVENTS = ROOT / "events"
START = {"workspace": "ws_control", "flow": "approval"}


class RecordingDrives:
    """A DriveStarter that records what it was asked to start; with an engine, it also
    drives the run there and then (to its end or its park)."""

    def __init__(self, engine: LocalEngine | None = None) -> None:
        self.started: list[tuple[str, str]] = []
        self.engine = engine

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append((tenant, run_id))
        if self.engine:
            self.engine.drive(tenant, run_id, tick_s=0.02)
        return f"drive-{len(self.started)}"


@pytest.fixture
def api_svc(svc: Services) -> Services:
    svc.workspaces = FolderWorkspaces(FIXTURES)
    svc.drives = RecordingDrives()
    return svc


def rest_event(
    method: str,
    path: str,
    body: Any = None,
    *,
    raw_body: str | None = None,
    query: dict[str, str] | None = None,
    tenant: str | None = "acme",
    cognito: str | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event: an IAM caller of `tenant` (its account id), and with
    `cognito`, a Cognito authorizer's `custom:tenant` claim as well."""
    context: dict[str, Any] = {
        "httpMethod": method,
        "path": "/Prod" + path,
        "resourcePath": path,
        "stage": "Prod",
        "requestId": "req-1",
        "identity": {"accountId": tenant, "sourceIp": "198.51.100.7"},
    }
    if cognito:
        context["authorizer"] = {"claims": {"sub": "u-1", "custom:tenant": cognito}}
    text = raw_body if raw_body is not None else (json.dumps(body) if body is not None else None)
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": context,
        "body": text,
        "isBase64Encoded": False,
    }


def call(svc: Services, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any, dict[str, list[str]]]:
    out = resolve(rest_event(method, path, body, **kwargs), None, svc)
    headers = {k.lower(): v for k, v in (out.get("multiValueHeaders") or {}).items()}
    content_type = (headers.get("content-type") or [""])[0]
    payload = json.loads(out["body"]) if content_type.startswith("application/json") else out["body"]
    return out["statusCode"], payload, headers


def start(svc: Services, body: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    status, run, _ = call(svc, "POST", "/runs", body or START, **kwargs)
    assert status == 201, run
    answer: dict[str, Any] = run
    return answer


def problem_fields(payload: dict[str, Any]) -> set[str]:
    return {p.get("field") for p in payload["problems"]}


# -- starting ----------------------------------------------------------------------------------


def test_start_answers_201_with_the_queued_run_and_its_location_and_starts_one_drive(api_svc: Services) -> None:
    status, run, headers = call(api_svc, "POST", "/runs", {**START, "input": {"topic": "kelp"}})

    assert status == 201
    assert (
        run["status"] == "queued" and run["tenant"] == "acme" and run["workspace"] == "ws_control" and run["flow"] == "approval"
    )
    assert [s["agent"] for s in run["steps"]] == ["writer", None, "poster"]
    assert headers["location"] == [f"/Prod/runs/{run['id']}"]
    assert api_svc.drives.started == [("acme", run["id"])]
    assert api_svc.store.get_run("acme", run["id"]).status == RunStatus.queued


def test_a_repeated_start_with_the_same_key_returns_the_same_run_and_starts_no_second_drive(api_svc: Services) -> None:
    body = {**START, "idempotency_key": "nightly-2026-11-30"}
    first = start(api_svc, body)
    assert first["id"] == idempotent_run_id("acme", "nightly-2026-11-30")
    # Given the first drive is still running,
    api_svc.store.update_run("acme", first["id"], RunChanges(status=RunStatus.running))

    # when the same start comes again (a client retrying after a timeout),
    status, again, headers = call(api_svc, "POST", "/runs", body)

    # then it is answered with the same run, and nothing new is started.
    assert status == 200 and again["id"] == first["id"] and again["status"] == "running"
    assert headers["location"] == [f"/Prod/runs/{first['id']}"]
    assert api_svc.drives.started == [("acme", first["id"])]
    assert len(api_svc.store.list_runs("acme")) == 1


def test_the_same_idempotency_key_with_a_different_request_is_a_409_and_starts_nothing(api_svc: Services) -> None:
    start(api_svc, {**START, "idempotency_key": "k1"})

    status, body, _ = call(api_svc, "POST", "/runs", {**START, "input": {"other": True}, "idempotency_key": "k1"})

    assert status == 409 and "idempotency_key" in body["message"]
    assert len(api_svc.drives.started) == 1 and len(api_svc.store.list_runs("acme")) == 1


def test_an_idempotency_key_names_a_run_per_tenant_never_another_tenants(api_svc: Services) -> None:
    a = start(api_svc, {**START, "idempotency_key": "same"}, tenant="acme")
    b = start(api_svc, {**START, "idempotency_key": "same"}, tenant="globex")

    assert a["id"] != b["id"] and b["tenant"] == "globex"
    assert api_svc.drives.started == [("acme", a["id"]), ("globex", b["id"])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"workspace": "ws_control"}, "flow"),  # missing
        ({"workspace": 7, "flow": "approval"}, "workspace"),  # wrong type
        ({**START, "input": ["not", "an", "object"]}, "input"),  # wrong type
        ({**START, "tenant": "globex"}, "tenant"),  # unknown: the tenant is never taken from a body
        ({**START, "idempotency_key": ""}, "idempotency_key"),  # too short
    ],
)
def test_a_start_that_does_not_fit_its_model_is_a_400_naming_the_field_and_writes_nothing(
    api_svc: Services, body: Any, field: str
) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", body)

    assert status == 400
    assert field in problem_fields(payload) and field in payload["message"]
    assert api_svc.drives.started == [] and api_svc.store.list_runs("acme") == []
    assert "globex" not in json.dumps(payload)  # the offending value is not echoed


def test_a_malformed_body_is_a_400_saying_so(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", raw_body="{workspace: ")

    assert status == 400 and payload["problems"][0]["in"] == "body" and "JSON" in payload["problems"][0]["message"]


def test_an_invalid_flow_is_a_400_listing_every_problem_with_its_file_and_no_local_path(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_broken", "flow": "messy"})

    assert status == 400
    assert len(payload["problems"]) >= 2
    assert all(p["file"] and not p["file"].startswith("/") for p in payload["problems"])
    assert str(FIXTURES) not in json.dumps(payload)
    assert api_svc.drives.started == [] and api_svc.store.list_runs("acme") == []


def test_an_input_that_does_not_fit_the_flows_schema_is_a_400_naming_it(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_ok", "flow": "brief", "input": {}})

    assert status == 400 and "input" in payload["message"]
    assert any("topics" in json.dumps(p) for p in payload["problems"])


def test_an_unknown_workspace_is_a_404_and_an_unknown_flow_a_400(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "nowhere", "flow": "brief"})
    assert status == 404 and payload["message"] == "no workspace 'nowhere'"

    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_control", "flow": "nothing"})
    assert status == 400 and "no flow 'nothing'" in payload["message"]


def test_without_a_drive_starter_a_start_is_a_503_and_nothing_is_written(api_svc: Services) -> None:
    api_svc.drives = None

    status, payload, _ = call(api_svc, "POST", "/runs", START)

    assert status == 503 and payload["message"] == "this deployment cannot start drives"
    assert api_svc.store.list_runs("acme") == []


def test_an_unexpected_error_is_a_500_with_a_generic_message_never_its_details(api_svc: Services) -> None:
    class Broken:
        def start(self, tenant: str, run_id: str) -> str:
            raise RuntimeError("boom at /home/ops/.aws/credentials secret=hunter2")

    api_svc.drives = Broken()

    status, payload, _ = call(api_svc, "POST", "/runs", START)

    assert status == 500 and payload == {"message": GENERIC_ERROR, "problems": []}


# -- reading -----------------------------------------------------------------------------------


def test_list_shows_the_callers_runs_newest_first_up_to_the_limit_and_get_shows_the_steps(api_svc: Services) -> None:
    ids = [start(api_svc)["id"] for _ in range(3)]

    status, payload, _ = call(api_svc, "GET", "/runs")
    assert status == 200 and [r["id"] for r in payload["runs"]] == ids[::-1]
    assert "steps" not in payload["runs"][0]

    status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": "2"})
    assert [r["id"] for r in payload["runs"]] == ids[:0:-1]

    status, run, _ = call(api_svc, "GET", f"/runs/{ids[0]}")
    assert status == 200 and run["id"] == ids[0]
    assert [(s["index"], s["status"]) for s in run["steps"]] == [(0, "pending"), (1, "pending"), (2, "pending")]


def test_a_limit_that_is_not_a_positive_number_is_a_400_naming_it(api_svc: Services) -> None:
    for bad in ("abc", "0"):
        status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": bad})
        assert status == 400 and problem_fields(payload) == {"limit"}


def test_another_tenants_run_is_a_404_exactly_like_a_missing_one_for_get_stop_and_approval(api_svc: Services) -> None:
    theirs = start(api_svc, tenant="acme")["id"]
    missing = "run-20000101-000000-000000"

    for method, suffix, body in (("GET", "", None), ("POST", "/stop", None), ("POST", "/approval", {"approve": True})):
        seen = call(api_svc, method, f"/runs/{theirs}{suffix}", body, tenant="globex")
        absent = call(api_svc, method, f"/runs/{missing}{suffix}", body, tenant="globex")
        assert seen[0] == absent[0] == 404
        assert seen[1]["message"].replace(theirs, "ID") == absent[1]["message"].replace(missing, "ID")

    assert call(api_svc, "GET", "/runs", tenant="globex")[1] == {"runs": []}
    untouched = api_svc.store.get_run("acme", theirs, steps=False)
    assert not untouched.stop_requested and untouched.status == RunStatus.queued
    assert len(api_svc.drives.started) == 1


def test_no_identity_is_a_401_on_every_run_route(api_svc: Services) -> None:
    for method, path, body in (
        ("POST", "/runs", START),
        ("GET", "/runs", None),
        ("GET", "/runs/run-x", None),
        ("POST", "/runs/run-x/stop", None),
        ("POST", "/runs/run-x/approval", {"approve": True}),
    ):
        status, payload, _ = call(api_svc, method, path, body, tenant=None)
        assert status == 401, (method, path)
        assert "identity" in payload["message"]
    assert api_svc.drives.started == []


def test_a_cognito_callers_tenant_claim_wins_over_the_account_id(api_svc: Services) -> None:
    run = start(api_svc, tenant="123456789012", cognito="acme")

    assert run["tenant"] == "acme"
    assert call(api_svc, "GET", f"/runs/{run['id']}", tenant=None, cognito="acme")[0] == 200
    assert call(api_svc, "GET", f"/runs/{run['id']}", tenant="123456789012")[0] == 404


# -- stop and approvals ------------------------------------------------------------------------


def test_stop_closes_a_queued_run_at_once_and_a_second_stop_says_already(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/stop")
    assert status == 200 and payload["message"] == f"run {run_id} stopped"
    assert payload["run"]["status"] == "failed" and payload["run"]["stop_requested"] is True

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/stop")
    assert status == 200 and "already stopped" in payload["message"]


def test_approving_a_parked_run_continues_it_in_a_new_drive_to_completion(api_svc: Services) -> None:
    # Given a run really driven (the embedded engine, the real definition) to its approval,
    api_svc.drives = RecordingDrives(local_engine(api_svc))
    run_id = start(api_svc)["id"]
    status, parked, _ = call(api_svc, "GET", f"/runs/{run_id}")
    assert parked["status"] == "awaiting-approval" and parked["steps"][1]["status"] == "awaiting-approval"

    # when a person approves it,
    status, answered, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": True})

    # then a second drive is started and carries it to the end.
    assert status == 200 and answered["id"] == run_id and answered["status"] == "queued"
    assert api_svc.drives.started == [("acme", run_id), ("acme", run_id)]
    done = api_svc.store.get_run("acme", run_id)
    assert done.status == RunStatus.completed and done.drives == 2
    assert [s.status for s in done.steps] == [StepStatus.completed] * 3
    # the record the viewer shows: costs and prompt-layer sizes per step
    _, shown, _ = call(api_svc, "GET", f"/runs/{run_id}")
    assert shown["steps"][0]["prompt_layers"] and all(layer["chars"] > 0 for layer in shown["steps"][0]["prompt_layers"])


def _parked_run(svc: Services, tenant: str = "acme") -> str:
    """A run parked at its approval, driven there by the embedded engine."""
    run = prepare_run(svc, FIXTURES / "ws_control", "approval", tenant=tenant)
    svc.store.create_run(run)
    assert local_engine(svc).drive(tenant, run.id, tick_s=0.02).run.status == RunStatus.awaiting_approval
    return run.id


def test_rejecting_a_parked_run_fails_it_and_starts_no_drive(api_svc: Services) -> None:
    run_id = _parked_run(api_svc)

    status, run, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": False})

    assert status == 200 and run["status"] == "failed" and run["error"] == "rejected by a person"
    assert api_svc.drives.started == []


def test_answering_a_run_that_is_not_waiting_is_a_409(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": True})

    assert status == 409 and "not waiting for an approval" in payload["message"]
    assert len(api_svc.drives.started) == 1


def test_an_approval_answer_must_be_a_boolean(api_svc: Services) -> None:
    for body in ({}, {"approve": "yes"}, {"approve": True, "note": "x"}):
        status, payload, _ = call(api_svc, "POST", "/runs/run-x/approval", body)
        assert status == 400 and problem_fields(payload) & {"approve", "note"}


# -- the document and the viewer ---------------------------------------------------------------


def test_the_openapi_document_lists_every_route(api_svc: Services) -> None:
    status, document, _ = call(api_svc, "GET", "/openapi.json", tenant=None)

    assert status == 200 and document["openapi"].startswith("3.")
    listed = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    assert listed == {
        ("/runs", "POST"),
        ("/runs", "GET"),
        ("/runs/{run_id}", "GET"),
        ("/runs/{run_id}/stop", "POST"),
        ("/runs/{run_id}/approval", "POST"),
        ("/runs/{run_id}/steps/{index}/answer", "POST"),
        ("/questions", "GET"),
        ("/estimates", "POST"),
        ("/openapi.json", "GET"),
        ("/", "GET"),
        ("/assets/{name}", "GET"),
    }
    assert len(listed) == len(app._static_routes + app._dynamic_routes)
    assert set(document["components"]["schemas"]["StartRun"]["properties"]) == {
        "workspace",
        "flow",
        "input",
        "model",
        "idempotency_key",
    }


def test_the_openapi_document_lists_the_400s_it_answers_and_never_a_422(api_svc: Services) -> None:
    _, document, _ = call(api_svc, "GET", "/openapi.json", tenant=None)

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (path, method)
            if path.startswith("/runs"):  # every run route reads a model: a misfit is a 400
                assert "400" in operation["responses"], (path, method)
                assert operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert "ValidationError" not in json.dumps(document)
    # ...and a request that does not fit is answered exactly so.
    status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": "0"})
    assert status == 400 and problem_fields(payload) == {"limit"}


def test_the_openapi_document_declares_sigv4_and_cognito_and_the_stages_server(api_svc: Services) -> None:
    event = rest_event("GET", "/openapi.json", tenant=None)
    event["headers"] = {"Host": "abc123.execute-api.eu-west-1.amazonaws.com", "X-Forwarded-Proto": "https"}
    document = json.loads(resolve(event, None, api_svc)["body"])

    schemes = document["components"]["securitySchemes"]
    assert schemes["sigv4"]["x-amazon-apigateway-authtype"] == "awsSigv4"
    assert schemes["cognito"]["x-amazon-apigateway-authtype"] == "cognito_user_pools"
    assert document["security"] == [{"sigv4": []}, {"cognito": []}]
    assert document["paths"]["/runs"]["post"]["security"] == [{"sigv4": []}, {"cognito": []}]
    assert document["paths"]["/"]["get"]["security"] == []  # the page and the document are public
    assert document["servers"][0]["url"] == "https://abc123.execute-api.eu-west-1.amazonaws.com/Prod"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/runs", "GET, POST"),
        ("PUT", "/runs/run-x", "GET"),
        ("GET", "/runs/run-x/stop", "POST"),
        ("GET", "/runs/run-x/approval", "POST"),
        ("POST", "/", "GET"),
        ("PATCH", "/openapi.json", "GET"),
        ("OPTIONS", "/runs", "GET, POST"),
    ],
)
def test_an_unsupported_method_on_a_known_route_is_a_405_with_allow(
    api_svc: Services, method: str, path: str, allowed: str
) -> None:
    before = api_svc.store.list_runs("acme")
    status, payload, headers = call(api_svc, method, path, {"approve": True})
    assert status == 405 and headers["allow"] == [allowed]
    assert allowed in payload["message"] and payload["problems"] == []
    assert api_svc.store.list_runs("acme") == before


def test_a_path_no_route_has_is_still_a_404(api_svc: Services) -> None:
    status, payload, headers = call(api_svc, "DELETE", "/no/such/route")
    assert status == 404 and "allow" not in headers and "/openapi.json" in payload["message"]


def test_the_viewer_page_loads_its_assets_from_the_stage_under_a_policy_of_this_origin_only(api_svc: Services) -> None:
    status, page, headers = call(api_svc, "GET", "/", tenant=None)  # through API Gateway: /Prod/

    assert status == 200 and headers["content-type"][0].startswith("text/html")
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert 'src="/Prod/assets/app.js"' in page and 'href="/Prod/assets/viewer.css"' in page
    assert "http://" not in page and "https://" not in page  # no asset from elsewhere
    policy = headers["content-security-policy"][0]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert headers["x-content-type-options"] == ["nosniff"]


def test_each_viewer_asset_is_served_with_its_type_and_an_unknown_one_is_a_404(api_svc: Services) -> None:
    status, script, headers = call(api_svc, "GET", "/assets/app.js", tenant=None)
    assert status == 200 and headers["content-type"][0].startswith("text/javascript") and 'from "preact"' in script
    status, style, headers = call(api_svc, "GET", "/assets/viewer.css", tenant=None)
    assert status == 200 and headers["content-type"][0].startswith("text/css")
    for missing in ("nope.js", "index.html", "VENDORED.md", "..%2Froutes.py"):
        status, payload, _ = call(api_svc, "GET", f"/assets/{missing}", tenant=None)
        assert status == 404, missing


# -- sample events -----------------------------------------------------------------------------


SAMPLE_TENANT = "123456789012"  # the sample events' caller: an IAM identity, its account is its tenant


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("api_start_run", 201),
        ("api_list_runs", 200),
        ("api_get_run", 200),
        ("api_stop_run", 200),
        ("api_answer_approval", 409),
        ("api_answer_question", 409),
        ("api_list_questions", 200),
    ],
)
def test_each_sample_event_parses_and_routes_to_its_handler(svc: Services, name: str, status: int) -> None:
    event = json.loads((EVENTS / f"{name}.json").read_text())
    parsed = APIGatewayProxyEventModel.model_validate(event)
    proxy = APIGatewayProxyEvent(event)
    assert parsed.httpMethod == proxy.http_method and parsed.path == proxy.path
    # Given the run the events name, of the tenant their caller belongs to (and examples/),
    svc.workspaces, svc.drives = FolderWorkspaces(EXAMPLES), RecordingDrives()
    run = prepare_run(svc, FIXTURES / "ws_control", "approval", tenant=SAMPLE_TENANT)
    run.id = "run-20261130-090000-abc123"
    svc.store.create_run(run)

    out = resolve(event, None, svc)
    payload = json.loads(out["body"])

    assert out["statusCode"] == status, payload
    if name == "api_start_run":
        assert payload["tenant"] == SAMPLE_TENANT and svc.drives.started == [(SAMPLE_TENANT, payload["id"])]
    if name == "api_list_runs":  # an IAM caller: its account is its tenant
        assert [r["id"] for r in payload["runs"]] == [run.id]
    if name == "api_get_run":
        assert payload["id"] == run.id and len(payload["steps"]) == 3
    if name == "api_stop_run":
        assert payload["run"]["stop_requested"] is True
    if name == "api_answer_approval":  # the approval handler's own refusal: the run is queued
        assert "not waiting for an approval" in payload["message"]
    if name == "api_answer_question":  # its step has asked nothing
        assert "waiting on no question" in payload["message"]
    if name == "api_list_questions":
        assert payload == {"questions": []}


def test_the_lambda_handler_resolves_with_the_installed_services(api_svc: Services) -> None:
    spec = importlib.util.spec_from_file_location("laneflow_functions.Api", ROOT / "functions" / "api" / "app.py")
    assert spec is not None and spec.loader is not None  # the file exists
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    install(api_svc)
    try:
        out = module.handler(rest_event("POST", "/runs", START), None)
    finally:
        install(None)
    assert out["statusCode"] == 201 and len(api_svc.drives.started) == 1


# -- laneflow serve ------------------------------------------------------------------------------


def http(
    base: str, method: str, path: str, body: Any = None, raw: bytes | None = None, content_type: str | None = "application/json"
) -> tuple[int, Any, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    # Without a content type, urllib labels a body as a form (as `curl -d` does).
    headers = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, headers, text = response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        status, headers, text = error.code, error.headers, error.read().decode()  # type: ignore[assignment]
    is_json = (headers.get("Content-Type") or "").startswith("application/json")
    return status, json.loads(text) if is_json else text, headers


@pytest.fixture
def served(api_svc: Services) -> Iterator[str]:
    server = make_server(api_svc, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.url
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_laneflow_serve_answers_the_same_routes_over_http_as_the_local_tenant(api_svc: Services, served: str) -> None:
    status, run, headers = http(served, "POST", "/runs", {**START, "idempotency_key": "k"})
    assert status == 201 and run["tenant"] == api_svc.settings.tenant == "local"
    assert headers["Location"] == f"/runs/{run['id']}"
    assert http(served, "POST", "/runs", {**START, "idempotency_key": "k"})[0] == 200
    assert api_svc.drives.started == [("local", run["id"])]

    status, listed, _ = http(served, "GET", "/runs?limit=5")
    assert status == 200 and [r["id"] for r in listed["runs"]] == [run["id"]]
    status, shown, _ = http(served, "GET", f"/runs/{run['id']}")
    assert status == 200 and len(shown["steps"]) == 3
    status, answered, _ = http(served, "POST", f"/runs/{run['id']}/approval", {"approve": True})
    assert status == 409
    status, stopped, _ = http(served, "POST", f"/runs/{run['id']}/stop")
    assert status == 200 and stopped["run"]["status"] == "failed"

    assert http(served, "POST", "/runs", {**START, "tenant": "acme"})[0] == 400
    assert http(served, "POST", "/runs", START, content_type=None)[0] == 415  # a body labelled as a form is not read
    assert http(served, "POST", "/runs", raw=b"\xff\xfe not json")[0] == 400
    assert http(served, "GET", "/runs/run-none")[0] == 404
    assert http(served, "GET", "/no/such/route")[0] == 404
    status, document, _ = http(served, "GET", "/openapi.json")
    assert status == 200 and "/runs/{run_id}/approval" in document["paths"]
    status, page, headers = http(served, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and "laneflow runs" in page
    assert 'src="/assets/app.js"' in page  # laneflow serve has no stage
    assert http(served, "GET", "/assets/app.js")[0] == 200
    status, _, headers = http(served, "DELETE", "/runs")
    assert status == 405 and headers["Allow"] == "GET, POST"
    with urllib.request.urlopen(
        urllib.request.Request(served + "/runs", method="HEAD"), timeout=10
    ) as head:  # GET without the body
        assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0


def test_laneflow_serve_streams_a_run_as_server_sent_events_until_it_ends(api_svc: Services, served: str) -> None:
    # Given a run that ends while a browser follows it,
    status, run, _ = http(served, "POST", "/runs", START)
    stream = urllib.request.urlopen(served + f"/runs/{run['id']}/stream", timeout=10)
    assert stream.headers["Content-Type"].startswith("text/event-stream")
    first = stream.readline(), stream.readline(), stream.readline(), stream.readline()
    assert first[0] == b"retry: 2000\n" and first[2] == b"event: run\n"
    assert json.loads(first[3].removeprefix(b"data: "))["status"] == "queued"
    # When it is stopped, the stream sends the record again, then says it ended.
    http(served, "POST", f"/runs/{run['id']}/stop")
    rest = stream.read().decode()
    records = [json.loads(line.removeprefix("data: ")) for line in rest.splitlines() if line.startswith("data: {")]
    assert records[-1]["status"] == "failed" and records[-1]["stop_requested"] is True
    assert rest.rstrip().endswith('event: end\ndata: "failed"')
    # An unknown run is a 404 (no stream); an id no run can have, a 400.
    assert http(served, "GET", "/runs/run-none/stream")[0] == 404
    assert http(served, "GET", "/runs/" + "x" * 129 + "/stream")[0] == 400


def test_laneflow_serve_answers_concurrent_callers(api_svc: Services, served: str) -> None:
    results: list[int] = []

    def one(i: int) -> None:
        results.append(http(served, "POST", "/runs", {**START, "idempotency_key": f"k{i % 4}"})[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)

    assert sorted(results) == [200] * 8 + [201] * 4
    assert len(api_svc.drives.started) == 4


def test_laneflow_serve_listens_on_loopback_only(api_svc: Services) -> None:
    with pytest.raises(InvalidInput, match="loopback"):
        make_server(api_svc, "0.0.0.0", 0)
