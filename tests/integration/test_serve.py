"""`laneflow serve` over real sockets on 127.0.0.1: it answers only requests for its own host
and origin, reads only JSON bodies of a bounded size, drops clients that stall, and a busy
port is one clear line. Every refusal is checked to have done nothing: no run started, no
run stopped or answered."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from contract.store.backends import BACKENDS
from helpers import FIXTURES, closed_within, pacing_workspace, started_drives

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.errors import InvalidInput
from laneflow.domain.records import Run, RunStatus
from laneflow.entrypoints.serve import MAX_BODY, ApiServer, make_server
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, local_drives

START = json.dumps({"workspace": "ws_control", "flow": "approval"}).encode()
JSON = [("Content-Type", "application/json")]
TIMEOUT_S = 1.0  # the served request deadline in these tests (5 s by default)


class RecordingDrives:
    """A drive starter that only records what it was asked to start."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append((tenant, run_id))
        return f"drive-{len(self.started)}"


@pytest.fixture
def server(svc: Services) -> Iterator[ApiServer]:
    svc.workspaces = FolderWorkspaces(FIXTURES)
    svc.drives = RecordingDrives()
    server = make_server(svc, "127.0.0.1", 0, request_timeout_s=TIMEOUT_S)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def port_of(server: ApiServer) -> int:
    return server.server_address[1]


def raw_request(
    server: ApiServer,
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
    *,
    host: str | None = "own",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {f'127.0.0.1:{port_of(server)}' if host == 'own' else host}")
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None and not any(k.lower() == "content-length" for k, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def exchange(
    server: ApiServer, raw: bytes, *, method: str = "GET", timeout: float = 10
) -> tuple[int, Any, http.client.HTTPMessage]:
    """Send raw bytes on a new connection; the status, the body (parsed when JSON), the headers."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=timeout) as sock:
        sock.sendall(raw)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        data = response.read()
    text = data.decode("utf-8")
    is_json = (response.headers.get("Content-Type") or "").startswith("application/json")
    return response.status, json.loads(text) if is_json and text else text, response.headers


def ask(
    server: ApiServer, method: str, path: str, headers: Sequence[tuple[str, str]] = (), body: bytes | None = None, **kw: Any
) -> tuple[int, Any, http.client.HTTPMessage]:
    return exchange(server, raw_request(server, method, path, headers, body, **kw), method=method)


def runs(server: ApiServer) -> list[Run]:
    return server.svc.store.list_runs(server.svc.settings.tenant, limit=500)


def a_run(server: ApiServer) -> str:
    status, run, _ = ask(server, "POST", "/runs", JSON, START)
    assert status == 201, run
    return cast(str, run["id"])


# -- its own host --------------------------------------------------------------------------------


def test_a_request_for_another_host_is_refused_with_421_and_starts_nothing(server: ApiServer) -> None:
    port = port_of(server)
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", f"localhost.evil.example:{port}"):
        status, body, headers = ask(server, "POST", "/runs", JSON, START, host=host)
        assert status == 421, (host, body)
        assert "own host" in body["message"] and headers["Content-Type"] == "application/json"
    assert runs(server) == [] and started_drives(server.svc) == []


def test_a_request_without_one_host_header_is_refused_with_400(server: ApiServer) -> None:
    assert ask(server, "POST", "/runs", JSON, START, host=None)[0] == 400
    own = f"127.0.0.1:{port_of(server)}"
    assert ask(server, "POST", "/runs", [("Host", own)] + JSON, START)[0] == 400  # two Host headers
    assert runs(server) == []


def test_every_name_of_its_own_address_is_answered(server: ApiServer) -> None:
    port = port_of(server)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert ask(server, "GET", "/runs", host=host)[0] == 200, host


def test_a_dns_rebinding_page_cannot_read_runs_either(server: ApiServer) -> None:
    a_run(server)
    status, body, _ = ask(server, "GET", "/runs", host="rebind.evil.example")
    assert status == 421 and "runs" not in body


def test_an_absolute_form_target_is_refused(server: ApiServer) -> None:
    status, body, _ = ask(server, "POST", "http://evil.example/runs", JSON, START)
    assert status == 400 and "path" in body["message"]
    assert runs(server) == []


# -- its own origin ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [("Origin", "http://evil.example")],
        [("Origin", "null")],
        [("Origin", "http://127.0.0.1:1")],
        [("Sec-Fetch-Site", "cross-site")],
        [("Sec-Fetch-Site", "same-site")],
    ],
    ids=["foreign-origin", "null-origin", "other-port", "fetch-cross-site", "fetch-same-site"],
)
def test_a_cross_site_start_stop_or_approval_is_refused_with_403_and_does_nothing(server: ApiServer, headers: Any) -> None:
    run_id = a_run(server)
    before = server.svc.store.get_run("local", run_id)
    approve = json.dumps({"approve": True}).encode()
    for path, body in (("/runs", START), (f"/runs/{run_id}/stop", None), (f"/runs/{run_id}/approval", approve)):
        status, answer, _ = ask(server, "POST", path, headers + JSON, body)
        assert status == 403 and "cross-site" in answer["message"], (path, answer)
    after = server.svc.store.get_run("local", run_id)
    assert len(runs(server)) == 1 and len(started_drives(server.svc)) == 1
    assert after.status == before.status == RunStatus.queued and not after.stop_requested


def test_its_own_origin_may_start_stop_and_read(server: ApiServer) -> None:
    origin = f"http://127.0.0.1:{port_of(server)}"
    status, run, _ = ask(server, "POST", "/runs", [("Origin", origin), ("Sec-Fetch-Site", "same-origin")] + JSON, START)
    assert status == 201
    status, stopped, _ = ask(server, "POST", f"/runs/{run['id']}/stop", [("Origin", f"http://localhost:{port_of(server)}")])
    assert status == 200 and stopped["run"]["status"] == "failed"
    # A cross-site page may link to the viewer: reading is not refused for its Origin.
    assert ask(server, "GET", "/", [("Sec-Fetch-Site", "cross-site")])[0] == 200


# -- JSON bodies only ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
        None,
    ],
)
def test_a_body_that_is_not_labelled_json_is_refused_with_415_and_starts_nothing(
    server: ApiServer, content_type: str | None
) -> None:
    headers = [("Content-Type", content_type)] if content_type else []
    status, body, _ = ask(server, "POST", "/runs", headers, START)
    assert status == 415 and "application/json" in body["message"], body
    assert runs(server) == [] and started_drives(server.svc) == []


def test_a_form_typed_stop_without_a_body_is_refused_with_415(server: ApiServer) -> None:
    run_id = a_run(server)
    status, _, _ = ask(server, "POST", f"/runs/{run_id}/stop", [("Content-Type", "text/plain")], b"")
    assert status == 415
    assert not server.svc.store.get_run("local", run_id).stop_requested
    assert ask(server, "POST", f"/runs/{run_id}/stop")[0] == 200  # curl -X POST sends no Content-Type


def test_a_json_body_with_a_utf8_charset_is_read(server: ApiServer) -> None:
    status, run, _ = ask(server, "POST", "/runs", [("Content-Type", 'Application/JSON; charset="UTF-8"')], START)
    assert status == 201 and run["workspace"] == "ws_control"


@pytest.mark.parametrize(
    "body, said",
    [
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": NaN}}', "NaN"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": -Infinity}}', "Infinity"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": 1e999}}', "too large"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": ' + b"7" * 5000 + b"}}", "5000 digits"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": "\\ud800"}}', "surrogate"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": ' + b"[" * 65 + b"]" * 65 + b"}", "nested"),
        (b"[" * 100_000, "nested"),
        (b'{"workspace": "ws_control\xff"}', "UTF-8"),
        (b"{'workspace': 1}", "not valid JSON"),
        (b'{"workspace": "ws_control", "flow": "approval", "input": {"x": 1, "x": 2}}', '$.input.x): the key "x" is given twice'),
    ],
    ids=["nan", "infinity", "overflow", "long-int", "surrogate", "deep", "very-deep", "not-utf8", "not-json", "repeated-key"],
)
def test_a_body_that_is_not_strict_json_is_refused_with_400_naming_the_body(server: ApiServer, body: Any, said: str) -> None:
    status, answer, _ = ask(server, "POST", "/runs", JSON, body)
    assert status == 400 and said in answer["message"] and answer["problems"][0]["in"] == "body", answer
    assert runs(server) == [] and started_drives(server.svc) == []


def test_a_body_over_1_mib_is_refused_with_413_and_the_refusal_is_readable(server: ApiServer) -> None:
    big = b'{"workspace": "' + b"w" * MAX_BODY + b'"}'
    status, answer, headers = ask(server, "POST", "/runs", JSON, big)
    assert status == 413 and "1 MiB" in answer["message"] and headers["Connection"] == "close"
    # A length that claims more than is sent is refused from its header alone.
    status, _, _ = ask(server, "POST", "/runs", JSON + [("Content-Length", str(10**12))], b"{}")
    assert status == 413
    assert runs(server) == []


def test_a_chunked_or_ambiguous_body_length_is_refused(server: ApiServer) -> None:
    assert ask(server, "POST", "/runs", JSON + [("Transfer-Encoding", "chunked")], b"")[0] == 411
    two = [("Content-Length", "2"), ("Content-Length", "3")]
    assert ask(server, "POST", "/runs", JSON + two, b"{}")[0] == 400
    assert ask(server, "POST", "/runs", JSON + [("Content-Length", "-1")], b"{}")[0] == 400
    assert runs(server) == []


# -- clients that stall --------------------------------------------------------------------------


def test_a_half_sent_request_is_dropped_after_its_deadline_while_others_are_answered(server: ApiServer) -> None:
    port = port_of(server)
    head = raw_request(server, "POST", "/runs", JSON + [("Content-Length", str(len(START)))])
    stalled = []
    for partial in (head[:20], head[:-3], head + START[:10]):  # a line, half the headers, half the body
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(partial)
        stalled.append(sock)
    try:
        assert ask(server, "GET", "/runs")[0] == 200
        # answered meanwhile, not after them: every stalled connection is still open then
        for sock in stalled:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # open, nothing to read (closed would read b"")
                sock.recv(1)
        # and then each is dropped (the wait's bound only keeps a server that never drops it from hanging)
        for sock in stalled:
            assert closed_within(sock, 30) is not None, "a stalled request was never dropped"
    finally:
        for sock in stalled:
            sock.close()
    assert runs(server) == []


def test_a_trickled_request_is_dropped_at_its_deadline_however_often_it_sends(server: ApiServer) -> None:
    raw = raw_request(server, "POST", "/runs", JSON, START)
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=5) as sock:
        dropped = None  # how many bytes were sent when the server dropped it
        for sent, byte in enumerate(raw):  # one byte every 0.1 s: never idle for long, never done
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                dropped = sent
                break
            sock.settimeout(0.1)
            try:
                if sock.recv(4096) == b"":
                    dropped = sent
                    break
            except TimeoutError:
                pass
            except ConnectionError:
                dropped = sent
                break
    # Dropped before the request was whole (TIMEOUT_S is ten bytes' worth): a deadline each
    # byte put off would have let all of it through and answered it
    assert dropped is not None and dropped < len(raw) - 1, f"not dropped while trickling {len(raw)} bytes"
    assert runs(server) == []


# -- what http.server itself refuses, as JSON ---------------------------------------------------


def test_an_unknown_method_is_405_and_a_malformed_request_a_json_400(server: ApiServer) -> None:
    status, body, headers = ask(server, "FROB", "/runs")
    assert status == 405 and headers["Content-Type"] == "application/json" and "FROB" in body["message"]
    status, body, _ = exchange(server, b"GET / HTTP/2.0\r\nHost: x\r\n\r\n")
    assert status == 400 and body["message"]
    status, body, _ = exchange(server, b"this is not http\r\n\r\n")
    assert status == 400 and "Traceback" not in json.dumps(body)


# -- a busy port ---------------------------------------------------------------------------------


def test_make_server_on_a_busy_port_is_invalid_input_naming_the_port(svc: Services) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(InvalidInput, match=f"port {port} on 127.0.0.1 is in use"):
            make_server(svc, "127.0.0.1", port)


def test_laneflow_serve_on_a_busy_port_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LANEFLOW_", "ANTHROPIC_"))}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "laneflow.entrypoints.cli",
                "serve",
                "--port",
                str(port),
                "--store",
                f"sqlite:///{tmp_path / 'x.db'}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"laneflow: port {port} on 127.0.0.1 is in use (another laneflow serve?): stop it, or choose another with --port"
    ]
    assert done.stdout == ""


# -- drives at once ------------------------------------------------------------------------------


@pytest.mark.slow
def test_serve_drives_runs_at_once_so_a_quick_run_started_after_a_slow_one_ends_first(tmp_path: Path, store_kind: str) -> None:
    # Given laneflow serve with its own drives (the embedded engine on a bounded pool)
    pacing_workspace(tmp_path, slow_ms=6000)
    with BACKENDS[store_kind](tmp_path) as store:
        svc = for_store(store, Settings(capture_dir=str(tmp_path / "captures"), local_drives=2))
        svc.workspaces = FolderWorkspaces(tmp_path)
        svc.drives = drives = local_drives(svc)
        server = make_server(svc, "127.0.0.1", 0, request_timeout_s=5)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            # When a slow run (one 6 s step) starts, and then a quick one
            slow = _start(server, "slow")
            _wait(server, slow, lambda run: run["status"] == "running" and run["steps"][0]["status"] == "running")
            quick = _start(server, "quick")
            # Then the quick one completes while the slow one still runs
            done = _wait(server, quick, lambda run: RunStatus(run["status"]).ended, timeout_s=60)
            assert done["status"] == "completed", done
            assert _get(server, slow)["status"] == "running"
            drives.join(60)
            assert _get(server, slow)["status"] == "completed"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


def _start(server: ApiServer, flow: str) -> str:
    status, run, _ = ask(server, "POST", "/runs", JSON, json.dumps({"workspace": "ws_pace", "flow": flow}).encode())
    assert status == 201, run
    return cast(str, run["id"])


def _get(server: ApiServer, run_id: str) -> dict[str, Any]:
    status, run, _ = ask(server, "GET", f"/runs/{run_id}")
    assert status == 200, run
    return cast(dict[str, Any], run)


def _wait(server: ApiServer, run_id: str, until: Callable[[dict[str, Any]], bool], timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        run = _get(server, run_id)
        if until(run) or time.monotonic() > deadline:
            return run
        time.sleep(0.05)
