"""What the HTTP API's tests share: API Gateway-shaped REST events as the Lambda handler
receives them (`rest_event`), a call through the API's resolver (`call`), a started run
(`start`), and a DriveStarter that records what it was asked to start (`RecordingDrives`)."""

from __future__ import annotations

import json
from typing import Any, cast

from helpers import FIXTURES, ROOT

from laneflow.adapters.engine.local import LocalEngine
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.entrypoints.api import resolve
from laneflow.ports import Services

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


def api_services(svc: Services) -> Services:
    """The services the API's tests call: the fixtures' workspaces, and drives recorded."""
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
    return cast(dict[str, Any], run)


def problem_fields(payload: dict[str, Any]) -> set[str]:
    return {p.get("field") for p in payload["problems"]}
