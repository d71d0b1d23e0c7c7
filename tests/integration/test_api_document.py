"""The HTTP API's document and pages (laneflow/api.py): the OpenAPI document, the 405s and 404s
of routes, the viewer and its assets, and the sample events (events/) routed through the
Lambda handler."""

from __future__ import annotations

import importlib.util
import json

import pytest
from api_calls import EVENTS, START, RecordingDrives, api_services, call, problem_fields, rest_event
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.parser.models import APIGatewayProxyEventModel
from helpers import EXAMPLES, FIXTURES, ROOT, started_drives

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.entrypoints.api import app, resolve
from laneflow.ports import Services
from laneflow.usecases.start_run import prepare_run
from laneflow.wiring import install


@pytest.fixture
def api_svc(svc: Services) -> Services:
    return api_services(svc)


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
        ("/runs/{run_id}/redrive", "POST"),
        ("/runs/{run_id}/steps/{index}/answer", "POST"),
        ("/questions", "GET"),
        ("/estimates", "POST"),
        ("/openapi.json", "GET"),
        ("/", "GET"),
        ("/assets/{name}", "GET"),
        ("/schedules", "POST"),
        ("/schedules", "GET"),
        ("/schedules/{schedule_id}", "GET"),
        ("/schedules/{schedule_id}", "DELETE"),
        ("/schedules/{schedule_id}/pause", "POST"),
        ("/schedules/{schedule_id}/resume", "POST"),
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
        ("api_redrive_run", 409),
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
        assert payload["tenant"] == SAMPLE_TENANT and started_drives(svc) == [(SAMPLE_TENANT, payload["id"])]
    if name == "api_list_runs":  # an IAM caller: its account is its tenant
        assert [r["id"] for r in payload["runs"]] == [run.id]
    if name == "api_get_run":
        assert payload["id"] == run.id and len(payload["steps"]) == 3
    if name == "api_stop_run":
        assert payload["run"]["stop_requested"] is True
    if name == "api_answer_approval":  # the approval handler's own refusal: the run is queued
        assert "not waiting for an approval" in payload["message"]
    if name == "api_redrive_run":  # the redrive's own refusal: the run has not failed
        assert "it has not failed, so there is nothing to redrive" in payload["message"]
    if name == "api_answer_question":  # its step has asked nothing
        assert "waiting on no question" in payload["message"]
    if name == "api_list_questions":
        assert payload == {"questions": []}


def test_the_lambda_handler_resolves_with_the_installed_services(api_svc: Services) -> None:
    spec = importlib.util.spec_from_file_location("laneflow_functions.Api", ROOT / "functions" / "api" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    install(api_svc)
    try:
        out = module.handler(rest_event("POST", "/runs", START), None)
    finally:
        install(None)
    assert out["statusCode"] == 201 and len(started_drives(api_svc)) == 1
