"""The API, in process through its resolver (as the Lambda handler and `laneflow serve` call
it), given arbitrary methods, paths, headers and bodies on every route: never a 5xx, never
a traceback in what it answers, nothing written for a refusal, and the store still lists."""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.adapters.store import open_store
from laneflow.entrypoints.api import resolve
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TENANT = "acme"


class NoDrives:
    """A drive starter that starts nothing: the fuzz is about what the API takes in."""

    def start(self, tenant: str, run_id: str) -> str:
        return "drive"


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[Services, str]]:
    folder = tempfile.mkdtemp(prefix="api-fuzz-")
    svc = for_store(open_store(f"sqlite:///{folder}/laneflow.db"), Settings(capture_dir=f"{folder}/captures"))
    svc.workspaces = FolderWorkspaces(FIXTURES)
    svc.drives = NoDrives()
    # One real run, so the per-run routes have something to find.
    out = resolve(event("POST", "/runs", {}, json.dumps({"workspace": "ws_control", "flow": "approval"})), None, svc)
    assert out["statusCode"] == 201, out
    yield svc, json.loads(out["body"])["id"]
    svc.store.close()
    shutil.rmtree(folder)


def event(
    method: str,
    path: str,
    headers: dict[str, str],
    body: str | None,
    *,
    base64_body: bool = False,
    query: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event of an IAM caller of TENANT."""
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "httpMethod": method,
            "path": "/Prod" + path,
            "resourcePath": path,
            "stage": "Prod",
            "requestId": "req-fuzz",
            "identity": {"accountId": TENANT, "sourceIp": "198.51.100.7"},
        },
        "body": body,
        "isBase64Encoded": base64_body,
    }


TEXT = st.text(max_size=30)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "workspace": st.sampled_from(["ws_control", "ws_ok", "../etc", "", "nowhere"]) | JSONISH,
        "flow": st.sampled_from(["approval", "brief", "../../x", ""]) | JSONISH,
        "input": JSONISH,
        "model": st.sampled_from(["stub", "", "claude-x"]) | JSONISH,
        "idempotency_key": TEXT | JSONISH,
        "approve": st.booleans() | JSONISH,
        "output_tokens": st.integers(-5, 10**7) | JSONISH,
        "tenant": TEXT,
        "expression": st.sampled_from(
            ["rate(5 minutes)", "cron(0 7 ? * MON-FRI *)", "cron(0 7 * * * *)", "at(2020-01-01T00:00:00)"]
        )
        | TEXT,
        "timezone": st.sampled_from(["Europe/Berlin", "UTC", "../../etc/passwd", "Nowhere/Zone"]) | JSONISH,
        "overlap": st.sampled_from(["skip", "allow", "buffer-one", "sometimes"]) | JSONISH,
    },
)


@st.composite
def bodies(draw: st.DrawFn) -> str | None:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.text(max_size=60))
    if kind == 2:  # deep nesting of either kind
        depth = draw(st.integers(0, 3000))
        return draw(st.sampled_from(["[", '{"input":'])) * depth
    text = json.dumps(draw(FIELDS | JSONISH), allow_nan=True, ensure_ascii=draw(st.booleans()))
    if kind == 3:
        at = draw(st.integers(0, len(text)))
        text = (
            text[:at]
            + draw(st.sampled_from(["NaN", "Infinity", "1e999", "\\ud800", "\\udc00\\udc00", "9" * 500, "}"]))
            + text[at:]
        )
    return text


HEADER_NAMES = st.sampled_from(
    ["Content-Type", "content-type", "Content-Length", "Authorization", "Origin", "X-Anything", "Host"]
)
HEADER_VALUES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=utf-16",
        "",
        "x" * 300,
    ]
) | st.text(max_size=20)
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO", "get", ""])


@st.composite
def paths(draw: st.DrawFn, real_run: str) -> str:
    run = draw(st.sampled_from([real_run, "run-nope", "x" * 200, "%2e%2e", "..", "a b", "\u00e9"]) | st.text(max_size=12))
    return draw(
        st.sampled_from(
            [
                "/runs",
                f"/runs/{run}",
                f"/runs/{run}/stop",
                f"/runs/{run}/approval",
                f"/runs/{run}/redrive",
                "/",
                "/openapi.json",
                "/runs/",
                "//runs",
                "/nothing",
                f"/runs/{run}/else",
                f"/runs/{run}/stream",
                "/assets/app.js",
                "/assets/preact.mjs",
                f"/assets/{run}",
                "/assets/",
                "/estimates",
                "/schedules",
                f"/schedules/{run}",
                f"/schedules/{run}/pause",
                f"/schedules/{run}/resume",
            ]
        )
    )


@pytest.mark.slow
@given(data=st.data())
def test_any_request_on_any_route_is_answered_below_500_and_a_refusal_writes_nothing(
    api: tuple[Services, str], data: st.DataObject
) -> None:
    svc, real_run = api
    method = data.draw(METHODS)
    path = data.draw(paths(real_run))
    headers = data.draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=4))
    body = data.draw(bodies())
    as_base64 = data.draw(st.booleans()) and body is not None
    if as_base64:
        assert body is not None
        body = data.draw(st.sampled_from([base64.b64encode(body.encode("utf-8", "surrogatepass")).decode(), body]))
    query = data.draw(
        st.none()
        | st.dictionaries(
            st.sampled_from(["limit", "x", "schedule"]), st.sampled_from(["1", "0", "-1", "abc", "9" * 50, ""]), max_size=2
        )
    )
    before = [r.id for r in svc.store.list_runs(TENANT, limit=500)]

    out = resolve(event(method, path, headers, body, base64_body=as_base64, query=query), None, svc)

    status, answer = out["statusCode"], str(out.get("body") or "")
    assert status < 500, (status, answer)
    assert "Traceback" not in answer and 'File "' not in answer
    after = [r.id for r in svc.store.list_runs(TENANT, limit=500)]
    if status >= 400:
        assert after == before  # a refusal wrote nothing
    assert svc.store.get_run(TENANT, real_run).id == real_run  # the store still reads


FINITE = st.recursive(  # values the API takes, so the repeated key is the one thing refused
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


@given(key=st.sampled_from(["workspace", "flow", "input", "model", "idempotency_key", "x"]), inner=st.booleans(), data=st.data())
def test_a_body_repeating_a_key_is_a_400_naming_it_and_starts_nothing(
    api: tuple[Services, str], key: str, inner: bool, data: st.DataObject
) -> None:
    """Whatever key a start body repeats, at its top or inside its input, the answer is a
    400 naming that field; nothing is written. (Read silently, the last one would win.)"""
    svc, _ = api
    first, second = (json.dumps(data.draw(FINITE, label=n)) for n in ("first", "second"))
    pair = f'"{key}": {first}, "{key}": {second}'
    body = ('{"workspace": "ws_control", "flow": "approval", "input": {' + pair + "}}") if inner else "{" + pair + "}"
    before = [r.id for r in svc.store.list_runs(TENANT, limit=500)]

    out = resolve(event("POST", "/runs", {"Content-Type": "application/json"}, body), None, svc)

    answer = json.loads(out["body"])
    assert out["statusCode"] == 400, answer
    field = f"input.{key}" if inner else key
    assert answer["problems"][0]["field"] == field and field in answer["message"], answer
    assert answer["problems"][0]["message"] == f"the key {json.dumps(key)} is given twice in one object; give it once"
    assert [r.id for r in svc.store.list_runs(TENANT, limit=500)] == before
