"""API tools (agent.md `apis:`) against a real HTTP server on 127.0.0.1, through the real
definition on the embedded engine, on both stores:
- the secret header reaches the server, filled in at call time, and the secret is in no stored
  byte (the SQLite file, the captures, events.jsonl; DynamoDB items and S3 objects under moto),
  also when the server echoes it back;
- another host is refused (an absolute URL, a path that escapes the base path, a redirect);
- a 4xx, a 5xx and a timeout are `is_error` results, and the step goes on;
- the response is cut at 30,000 characters, saying so;
- the Claude executor offers and runs the same tools (the Messages API imitation);
- an OpenAPI file's operations are in the `apis` prompt layer, stable.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, data_of, drive, error_of, stored_bytes, write_workspace
from pydantic import SecretStr

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.records import EventType, RunStatus, Step
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store
from laneflow_dev.imitation import MessagesImitation, Reply, default_responder

TOKEN = "tracker-token-5f1c9a77d2"


class Handler(BaseHTTPRequestHandler):
    """Answers by path (`ROUTES`); keeps what each request carried on its server's `Server`."""

    owner: Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self.owner.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        route = ROUTES.get(self.path.split("?")[0])
        if route is None:
            return self.send(200, json.dumps({"method": self.command, "path": self.path, "body": body}))
        route(self)

    def send(self, status: int, text: str, kind: str = "application/json", location: str = "") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer


def _slow(h: Handler) -> None:
    if h.owner.on_slow:
        h.owner.on_slow()
    time.sleep(6 if h.owner.on_slow else 3)
    try:
        h.send(200, "late")
    except BrokenPipeError:  # the client gave up, as it should have
        pass


ROUTES: dict[str, Callable[[Handler], None]] = {
    "/api/v1/slow": _slow,
    "/api/v1/big": lambda h: h.send(200, "x" * 45_000, "text/plain"),
    "/api/v1/missing": lambda h: h.send(404, '{"error": "no such issue"}'),
    "/api/v1/boom": lambda h: h.send(500, "it broke"),
    # a careless server echoes the credential back
    "/api/v1/whoami": lambda h: h.send(200, json.dumps({"token": h.headers.get("X-Token")})),
    "/api/v1/away": lambda h: h.send(302, "", location=f"http://localhost:{h.owner.port}/api/v1/echo"),
    "/api/v1/inside": lambda h: h.send(302, "", location="/api/v1/echo?moved=1"),
}


class Server:
    """A small HTTP server on 127.0.0.1 in a thread; keeps what each request carried."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.on_slow: Any = None  # called when a request for /slow arrives
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Bound", (Handler,), {"owner": self}))
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def tracker_workspace(tmp_path: Path, url: str, calls: list[str], *, timeout: float | None = None, **agent: Any) -> Path:
    stub = "\n".join(f"tool: api_tracker {c}" for c in calls) + "\n===\nDone."
    settings: dict[str, Any] = {
        "secrets": ["TRACKER_TOKEN"],
        "apis": [{"name": "tracker", "base_url": url, "headers": {"X-Token": "${TRACKER_TOKEN}", "Accept": "application/json"}}],
        "stub": stub,
        **agent,
    }
    if timeout:
        settings["timeout"] = timeout
    ws = write_workspace(tmp_path / "ws", {"fixer": settings}, {"fix": {"steps": [{"agent": "fixer", "instruction": "Fix it."}]}})
    (ws / ".secrets.env").write_text(f"TRACKER_TOKEN={TOKEN}\n")
    return ws


def tool_results(step: Step) -> list[tuple[str, bool]]:
    """(the call's output as captured, whether it was an error), in order."""
    return [(e.text, bool(e.data and e.data.get("is_error"))) for e in step.events if e.type == EventType.tool]


def outputs(svc: Any, step: Step) -> list[tuple[str, bool]]:
    found = []
    for e in step.events:
        if e.type == EventType.tool:
            capture = svc.captures.get(data_of(e)["capture"])
            found.append((capture["output"], bool(data_of(e).get("is_error"))))
    return found


# -- the secret header --------------------------------------------------------------------------


def test_the_secret_header_reaches_the_server_and_no_stored_byte_holds_the_secret(
    on: ServicesOn, tmp_path: Path, server: Server
) -> None:
    svc = on()
    ws = tracker_workspace(
        tmp_path,
        server.url,
        ['{"method": "POST", "path": "/issues", "query": {"label": "bug"}, "body": {"title": "x"}}', '{"path": "/whoami"}'],
    )

    run = drive(svc, ws, "fix")

    assert run.status == RunStatus.completed, run.error
    first, second = server.seen
    assert first["method"] == "POST" and first["path"] == "/api/v1/issues?label=bug"
    assert first["headers"]["X-Token"] == TOKEN and first["headers"]["Accept"] == "application/json"
    assert first["headers"]["Content-Type"] == "application/json" and json.loads(first["body"]) == {"title": "x"}
    assert second["headers"]["X-Token"] == TOKEN
    [(created, failed), (echoed, _)] = outputs(svc, run.steps[0])
    assert not failed and created.startswith("HTTP 200 OK\ncontent-type: application/json")
    assert "(sent the headers Accept, X-Token)" in created  # names only
    assert '"token": "[TRACKER_TOKEN]"' in echoed  # the echo is masked
    said = [e.text for e in run.steps[0].events if e.type == EventType.info]
    assert f"API tools: api_tracker reaches {server.url} sending Accept, X-Token" in said
    assert TOKEN.encode() not in stored_bytes(on.kind, tmp_path)
    assert b"tracker-token" not in stored_bytes(on.kind, tmp_path)


# -- what is refused ----------------------------------------------------------------------------


def test_another_host_is_refused_as_an_error_and_no_request_leaves(svc: Services, tmp_path: Path, server: Server) -> None:
    ws = tracker_workspace(
        tmp_path,
        server.url,
        [
            f'{{"path": "http://localhost:{server.port}/api/v1/echo"}}',  # another host name
            '{"path": "//example.com/x"}',
            '{"path": "../admin"}',  # escapes the base path
            '{"path": "/%2e%2e/admin"}',
            f'{{"path": "http://127.0.0.1:{server.port + 1 if server.port < 65535 else 1}/api/v1/echo"}}',  # another port
            '{"path": "/away"}',  # a redirect to another host
            '{"path": "/inside"}',  # a redirect within the API: followed
        ],
    )

    run = drive(svc, ws, "fix")

    assert run.status == RunStatus.completed, run.error
    results = outputs(svc, run.steps[0])
    assert [failed for _, failed in results] == [True] * 6 + [False]
    assert all("refused" in text for text, _ in results[:6])
    assert "is not this API's host" in results[0][0] and "outside the API's base path /api/v1/" in results[2][0]
    assert "redirected (302)" in results[5][0]
    assert [s["path"] for s in server.seen] == ["/api/v1/away", "/api/v1/inside", "/api/v1/echo?moved=1"]
    assert '"moved=1"' not in results[6][0] and "/api/v1/echo?moved=1" in results[6][0]


def test_a_4xx_a_5xx_and_a_timeout_are_errors_and_the_step_goes_on(svc: Services, tmp_path: Path, server: Server) -> None:
    ws = tracker_workspace(tmp_path, server.url, ['{"path": "/missing"}', '{"path": "/boom"}', '{"path": "/slow"}'], timeout=1.5)

    run = drive(svc, ws, "fix")

    assert run.status == RunStatus.completed, run.error
    (missing, e1), (boom, e2), (slow, e3) = outputs(svc, run.steps[0])
    assert e1 and e2 and e3
    assert missing.startswith("api_tracker: the API answered 404\nHTTP 404") and '"no such issue"' in missing
    assert boom.startswith("api_tracker: the API answered 500") and "it broke" in boom
    assert slow.startswith("api_tracker: no answer within") and "given up" in slow
    waited = float(slow.removeprefix("api_tracker: no answer within ").split(" s")[0])
    assert waited <= 1.5  # what was left of the step's timeout: 1.5 s, not the 60 s a call may take


def test_the_response_is_cut_at_30000_characters_saying_so(svc: Services, tmp_path: Path, server: Server) -> None:
    ws = tracker_workspace(tmp_path, server.url, ['{"path": "/big"}'])
    run = drive(svc, ws, "fix")
    [(text, failed)] = outputs(svc, run.steps[0])
    body = text.split("--- body ---\n", 1)[1]
    assert not failed and body.startswith("x" * 30_000) and body[30_000:] == "\n[body cut at 30,000 of 45,000 characters]"


def test_a_call_input_that_is_not_what_the_tool_takes_is_an_error(svc: Services, tmp_path: Path, server: Server) -> None:
    ws = tracker_workspace(
        tmp_path,
        server.url,
        ['{"verb": "GET"}', '{"method": "GET", "path": "/x", "body": "hi"}', '{"method": "TRACE", "path": "/x"}'],
    )
    run = drive(svc, ws, "fix")
    results = outputs(svc, run.steps[0])
    assert [f for _, f in results] == [True, True, True] and server.seen == []
    assert "unknown key 'verb'" in results[0][0] and "has no body" in results[1][0] and "method is one of" in results[2][0]


# -- the Claude executor ------------------------------------------------------------------------


def test_the_claude_executor_offers_and_runs_the_api_tool(tmp_path: Path, server: Server) -> None:
    key = "sk-test-0123456789abcdef"
    bodies: list[dict[str, Any]] = []

    def recording(body: dict[str, Any]) -> Reply:
        bodies.append(body)
        return default_responder(body)

    with MessagesImitation(api_keys={key}) as api:
        api.responder = recording
        cfg = Settings(anthropic_api_key=SecretStr(key), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), cfg)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=api.url, backoff_s=0.01)
        ws = tracker_workspace(tmp_path, server.url, [])
        lines = [
            '[[tool api_tracker {"path": "/issues/7"}]]',
            '[[tool api_tracker {"path": "/missing"}]]',
            "[[reply Ticket seven read.]]",
        ]
        (ws / "flows" / "fix.yaml").write_text(
            "steps:\n  - agent: fixer\n    instruction: |\n" + "".join(f"      {line}\n" for line in lines)
        )
        run = drive(svc, ws, "fix", model="claude-sonnet-4-6")
    assert run.status == RunStatus.completed, run.error
    assert [t["name"] for t in bodies[0]["tools"]] == ["api_tracker", "list_files", "read_file", "write_file"]
    assert server.seen[0]["path"] == "/api/v1/issues/7" and server.seen[0]["headers"]["X-Token"] == TOKEN
    results = [
        b
        for m in bodies[-1]["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert [r.get("is_error", False) for r in results] == [False, True]
    assert '"path": "/api/v1/issues/7"' in str(results[0]["content"]) and "404" in str(results[1]["content"])
    assert TOKEN not in json.dumps(bodies)  # the model never sees the credential
    assert TOKEN.encode() not in stored_bytes("sqlite", tmp_path)


# -- the prompt layer ---------------------------------------------------------------------------


def test_an_openapi_files_operations_are_listed_in_the_stable_apis_layer(tmp_path: Path) -> None:
    ws_root = tracker_workspace(tmp_path, "https://tracker.example.com/api/v1", [])
    agent_md = ws_root / "agents" / "fixer" / "agent.md"
    agent_md.write_text(agent_md.read_text().replace("  headers:", "  openapi: api/openapi.yaml\n  headers:"))
    (ws_root / "agents" / "fixer" / "api").mkdir()
    (ws_root / "agents" / "fixer" / "api" / "openapi.yaml").write_text(
        "openapi: 3.0.0\npaths:\n  /issues:\n    get: {summary: List issues}\n    post: {operationId: createIssue}\n"
        '  /issues/{id}:\n    delete: {description: "Delete an issue.\\nForever."}\n'
    )
    ws = load_workspace(ws_root)
    prompt = build_system_prompt(ws, load_agent(ws, "fixer"))
    [layer] = [layer for layer in prompt.layers if layer.name == "apis"]
    assert not layer.dynamic and layer.text in prompt.stable
    assert "## api_tracker: https://tracker.example.com/api/v1 (sends the headers Accept, X-Token)" in layer.text
    assert "- GET /issues: List issues\n- POST /issues: createIssue\n- DELETE /issues/{id}: Delete an issue." in layer.text
    assert TOKEN not in prompt.stable + prompt.dynamic


def test_in_a_sandboxed_step_the_call_is_made_by_the_sandbox_worker_with_the_same_code(
    svc: Services, tmp_path: Path, server: Server
) -> None:
    ws = tracker_workspace(tmp_path, server.url, ['{"path": "/issues"}', '{"path": "http://example.com/"}'], sandbox=True)
    run = drive(svc, ws, "fix")
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert any("sandbox worker" in e.text for e in step.events)  # it ran whole in the child
    assert server.seen[0]["headers"]["X-Token"] == TOKEN
    assert [failed for _, failed in outputs(svc, step)] == [False, True]
    assert TOKEN.encode() not in stored_bytes("sqlite", tmp_path)


def test_a_stop_during_a_call_ends_the_step_at_once(svc: Services, tmp_path: Path, server: Server) -> None:
    from laneflow.usecases.stop import stop_run

    ws = tracker_workspace(tmp_path, server.url, ['{"path": "/slow"}'])
    handling: list[threading.Thread] = []  # the server's thread for the call: it answers 6 s after the stop
    server.on_slow = lambda: (
        stop_run(svc, "local", svc.store.list_runs("local")[0].id),
        handling.append(threading.current_thread()),  # type: ignore[func-returns-value]
    )
    run = drive(svc, ws, "fix")
    [step] = run.steps
    assert run.status == RunStatus.failed and run.stop_requested
    assert error_of(step).startswith("stopped by a person (during its api_tracker call"), step.error
    # The call was left, not waited for: the run ended while the server still held its answer
    [handler] = handling
    assert handler.is_alive(), "the server had answered before the run ended"
