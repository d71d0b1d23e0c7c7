"""A bounded fuzz of `laneflow serve` on 127.0.0.1, on both stores: a fixed number of
requests with random methods, paths, Host, Origin, Sec-Fetch-Site and Content-Type headers,
Content-Lengths that lie, and bodies that are garbage, too large, NaN or nested deep, sent
from several threads while some clients stall half-way.

What must hold: no 5xx, no traceback in any answer, every refusal a JSON error; nothing
done on a refusal (the runs stored are exactly those a 201 announced, and a run is stopped
only if a stop of it was answered 200); stalled clients are dropped at the deadline while
the others are answered; afterwards the store still lists and the server still answers.

The seed is fixed (LANEFLOW_FUZZ_SEED picks another), so a failure can be replayed.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest
from helpers import FIXTURES, ROOT, closed_within, started_drives

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.adapters.store import Store, open_store
from laneflow.entrypoints.serve import MAX_BODY, ApiServer, make_server
from laneflow.settings import Settings
from laneflow.wiring import for_store

SEED = int(os.environ.get("LANEFLOW_FUZZ_SEED", "20240917"))
REQUESTS = 300
TIMEOUT_S = 1.0  # the served request deadline (5 s by default)
STALLED = 6
TENANT = "local"


class RecordingDrives:
    """A drive starter that records what it was asked to start (the fuzz is of the entrance)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()

    def start(self, tenant: str, run_id: str) -> str:
        with self._lock:
            self.started.append(run_id)
        return "drive"


# -- the stores ------------------------------------------------------------------------------


@contextmanager
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{tmp_path / 'fuzz.db'}")
    try:
        yield store
    finally:
        store.close()


@contextmanager
def dynamodb_store(tmp_path: Path) -> Iterator[Store]:
    """A DynamoDB table under moto, built from template.yaml's own RunsTable."""
    import boto3
    from moto import mock_aws

    from laneflow.adapters.store.provision import table_spec
    from laneflow_dev.moto_support import serialized_dynamodb

    with mock.patch.dict(os.environ), mock_aws(), serialized_dynamodb():
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[key]
        os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        boto3.client("dynamodb").create_table(TableName="fuzz-runs", **table_spec(ROOT / "template.yaml"))
        boto3.client("s3").create_bucket(Bucket="fuzz-blobs")
        store = open_store("dynamodb://fuzz-runs?bucket=fuzz-blobs")
        try:
            yield store
        finally:
            store.close()


STORES = {"sqlite": sqlite_store, "dynamodb": dynamodb_store}


@pytest.fixture
def server(store_kind: str, tmp_path: Path) -> Iterator[ApiServer]:
    with STORES[store_kind](tmp_path) as store:
        svc = for_store(store, Settings(capture_dir=str(tmp_path / "captures")))
        svc.workspaces = FolderWorkspaces(FIXTURES)
        svc.drives = RecordingDrives()
        server = make_server(svc, "127.0.0.1", 0, request_timeout_s=TIMEOUT_S)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


# -- requests ----------------------------------------------------------------------------------


@dataclass
class Sent:
    method: str
    path: str
    raw: bytes
    may_stall: bool  # it claims more body than it sends: the server may drop it unanswered
    must_refuse: bool = False  # another host, cross-site, or a state change labelled other than JSON


@dataclass
class Answer:
    status: int | None  # None: the connection was closed with no answer
    content_type: str
    text: str


START = {"workspace": "ws_control", "flow": "approval"}


def bodies(rng: random.Random) -> bytes | None:
    choice = rng.randrange(14)
    if choice == 0:
        return None
    if choice <= 3:
        return json.dumps({**START, "idempotency_key": f"k{rng.randrange(5)}"} if rng.random() < 0.5 else START).encode()
    if choice == 4:
        return json.dumps({"approve": rng.choice([True, False, "yes", 1, None])}).encode()
    if choice == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
    if choice == 6:
        return b'{"workspace": "ws_control", "flow": "approval", "input": {"x": NaN, "y": Infinity}}'
    if choice == 7:
        depth = rng.choice([65, 1000, 200_000])
        return b'{"workspace": "ws_control", "flow": "approval", "input": ' + b"[" * depth + b"]" * depth + b"}"
    if choice == 8:
        return b'{"workspace": "ws_control", "flow": "approval", "input": {"n": ' + b"9" * 6000 + b"}}"
    if choice == 9:
        return b'{"workspace": "ws_control", "flow": "approval", "input": {"s": "\\udc00"}}'
    if choice == 10:
        return rng.choice([b"null", b"[]", b"{}", b'"text"', b"1e999", b"", b" ", b"{"])
    if choice == 11:
        return b'{"workspace": "' + "é".encode() * rng.choice([100, MAX_BODY // 2 + 10]) + b'", "flow": "x"}'
    if choice == 12:
        return json.dumps({**START, "tenant": "acme", "input": {"k": "v" * rng.randrange(1000)}}).encode()
    return b'{"workspace": "ws_control\xc3\x28", "flow": "approval"}'  # not UTF-8


def _wrong_part(rng: random.Random, wrong: str, port: int, own: str) -> object:
    """A wrong value for one part of a request."""
    choices: dict[str, list[object]] = {
        "method": ["HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "get", "FROB", "G\x00T", "POST", "GET"],
        "path": [
            "/",
            "/runs?limit=-1",
            "/runs?limit=x&limit=9",
            "/openapi.json",
            "//runs",
            "/runs/",
            "/no/such",
            "/runs#frag",
            "http://evil.example/runs",
            "*",
            "/" + "x" * 3000,
            "/runs/%00/stop",
            "/runs/" + "a" * 300,
            "/runs/../../etc/passwd",
            "/runs/run-none/stream",
            "/runs/%2e%2e/stream",
            "/runs/" + "b" * 300 + "/stream",
            "/runs//stream",
            "/assets/app.js",
            "/assets/..%2fserve.py",
            "/assets/",
        ],
        "host": [
            f"localhost:{port}",
            f"[::1]:{port}",
            "evil.example",
            f"evil.example:{port}",
            f"127.0.0.1:{port + 1}",
            "",
            None,
            "two",
        ],
        "origin": ["http://evil.example", "null", f"http://localhost:{port}", f"https://{own}", f"http://127.0.0.1:{port + 1}"],
        "site": ["cross-site", "same-site", "none", "CROSS-SITE"],
        "content_type": [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=b",
            "application/json; charset=latin-1",
            None,
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/jsonp",
        ],
        "lie": ["less", "more", "none", "bad", "two", "huge"],
        "version": ["HTTP/1.0", "HTTP/2.0", "HTTP/9", ""],
        "extra": [[("Expect", "100-continue")], [("Transfer-Encoding", "chunked")], [("X-Filler", "f" * 100)] * 120],
    }
    if wrong == "body":
        return bodies(rng)
    return rng.choice(choices[wrong])


def _length_headers(rng: random.Random, lie: str, body: bytes | None) -> tuple[list[tuple[str, str]], bool]:
    """The Content-Length headers a request says (true, or one of its lies), and whether the
    server may rightly wait for more."""
    size = len(body or b"")
    if lie == "true":
        return ([("Content-Length", str(size))] if body is not None else []), False
    lies: dict[str, list[tuple[str, str]]] = {
        "less": [("Content-Length", str(size // 2))] if size > 1 else [],
        "more": [("Content-Length", str(size + 50))],
        "bad": [("Content-Length", rng.choice(["-5", "abc", "1e3", "0x10", " "]))],
        "two": [("Content-Length", str(size)), ("Content-Length", str(size + 1))],
        "huge": [("Content-Length", str(10**15))],
    }
    return lies.get(lie, []), lie == "more"


def a_request(rng: random.Random, port: int, run_ids: list[str]) -> Sent:
    """A request that would be answered (a read, a start, a stop, an approval), with none to
    four of its parts made wrong, so that each refusal is also met on its own."""
    own = f"127.0.0.1:{port}"
    run_id = rng.choice(run_ids)
    method, path, body = rng.choice(
        [
            ("GET", "/runs", None),
            ("GET", f"/runs/{run_id}", None),
            ("POST", "/runs", json.dumps(START).encode()),
            ("POST", "/runs", json.dumps({**START, "idempotency_key": f"k{rng.randrange(4)}"}).encode()),
            ("POST", f"/runs/{run_id}/stop", None),
            ("POST", f"/runs/{run_id}/approval", json.dumps({"approve": True}).encode()),
        ]
    )
    parts: dict[str, Any] = {
        "method": method,
        "path": path,
        "body": body,
        "host": own,
        "origin": rng.choice([None, f"http://{own}"]),
        "site": rng.choice([None, "same-origin"]),
        "content_type": "application/json" if body is not None else None,
        "lie": "true",
        "version": "HTTP/1.1",
        "extra": [],
    }
    names = ["method", "path", "host", "origin", "site", "content_type", "body", "lie", "version", "extra"]
    for wrong in rng.sample(names, rng.choice([0, 1, 1, 1, 2, 2, 3, 4])):
        parts[wrong] = _wrong_part(rng, wrong, port, own)
    method, path, body, host = parts["method"], parts["path"], parts["body"], parts["host"]
    origin, site, content_type, version = parts["origin"], parts["site"], parts["content_type"], parts["version"]

    headers: list[tuple[str, str]] = []
    if host == "two":
        headers += [("Host", own), ("Host", "evil.example")]
    elif host is not None:
        headers.append(("Host", host))
    headers += [("Origin", origin)] if origin else []
    headers += [("Sec-Fetch-Site", site)] if site else []
    headers += [("Content-Type", content_type)] if content_type else []
    headers += parts["extra"]
    lengths, waits = _length_headers(rng, parts["lie"], body)
    headers += lengths
    may_stall = not version or waits  # a one-word request line may never end its headers

    # What the rules refuse whatever else is wrong: another host; a state change from another
    # site; a state change labelled other than JSON.
    own_hosts = {own, f"localhost:{port}", f"[::1]:{port}"}
    changes = method in ("POST", "PUT", "PATCH", "DELETE")
    json_type = (
        content_type is not None
        and content_type.split(";")[0].strip().lower() == "application/json"
        and "latin-1" not in content_type
    )
    must_refuse = (
        host not in own_hosts
        or (
            changes
            and (
                origin not in (None, f"http://{own}", f"http://localhost:{port}")
                or (site or "").lower() in ("cross-site", "same-site")
            )
        )
        or (changes and content_type is not None and not json_type)
    )
    line = f"{method} {path} {version}".rstrip()
    head = "\r\n".join([line, *(f"{k}: {v}" for k, v in headers)]) + "\r\n\r\n"
    return Sent(method, path, head.encode("latin-1", "replace") + (body or b""), may_stall, must_refuse)


def send(port: int, sent: Sent) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S + 4) as sock:
        try:
            sock.sendall(sent.raw)
        except OSError:
            pass  # the server may refuse before the whole of a large body is sent: read its answer
        response = http.client.HTTPResponse(sock, method="HEAD" if sent.method == "HEAD" else "GET")
        try:
            response.begin()
            text = response.read().decode("utf-8", "replace")
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.IncompleteRead, TimeoutError):
            return Answer(None, "", "")
        return Answer(response.status, response.headers.get("Content-Type") or "", text)


def stall(port: int, partial: bytes) -> float | None:
    """Send part of a request and wait; how long until the server dropped it (None: never)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S + 4) as sock:
        sock.sendall(partial)
        return closed_within(sock, 30)  # generous: it only keeps a server that never drops it from hanging


# -- the fuzz ----------------------------------------------------------------------------------


def test_a_bounded_fuzz_of_serve_gets_no_5xx_and_changes_nothing_on_a_refusal(server: ApiServer) -> None:
    port = server.server_address[1]
    rng = random.Random(SEED)
    svc = server.svc

    own = f"127.0.0.1:{port}"
    head = f"POST /runs HTTP/1.1\r\nHost: {own}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n".encode()

    def start_one() -> str:
        body = json.dumps(START).encode()
        answer = send(port, Sent("POST", "/runs", head.replace(b"200", str(len(body)).encode()) + body, False))
        assert answer.status == 201, answer
        return cast(str, json.loads(answer.text)["id"])

    run_ids = [start_one() for _ in range(3)]  # what the fuzz stops, approves and reads
    requests = [a_request(rng, port, run_ids) for _ in range(REQUESTS)]
    partials = [b"P", b"POST /runs HTT", head[:30], head[:-2], head + b'{"workspace"', head + b"{" * 150][:STALLED]

    with ThreadPoolExecutor(max_workers=4 + STALLED) as pool:
        stalls = [pool.submit(stall, port, p) for p in partials]
        answers = list(pool.map(lambda s: send(port, s), requests))
        dropped = [f.result() for f in stalls]

    for sent, answer in zip(requests, answers, strict=True):
        where = f"{sent.raw[:160]!r}"
        if answer.status is None:
            assert sent.may_stall, f"no answer to {where}"
            continue
        assert answer.status < 500, f"{answer.status} {answer.text[:300]} for {where}"
        if sent.must_refuse:
            assert answer.status >= 400, f"{answer.status} for {where}"
        assert "Traceback" not in answer.text and 'File "' not in answer.text, where
        if answer.status >= 400:
            assert answer.content_type.startswith("application/json"), where
            if sent.method != "HEAD":
                assert json.loads(answer.text)["message"], where
    assert None not in dropped, f"the server kept a stalled request open: {dropped}"

    # Nothing done on a refusal: the runs are those the 201s announced, each with one drive.
    created = {json.loads(a.text)["id"] for a in answers if a.status == 201} | set(run_ids)
    stored = svc.store.list_runs(TENANT, limit=500)  # the store still lists
    assert {r.id for r in stored} == created
    assert sorted(started_drives(svc)) == sorted(created)
    stopped = {
        s.path.split("/")[2] for s, a in zip(requests, answers, strict=True) if a.status == 200 and s.path.endswith("/stop")
    }
    for run in stored:
        assert run.stop_requested == (run.id in stopped), run.id
    # The server still answers, and as before.
    final = send(port, Sent("GET", "/runs", f"GET /runs?limit=500 HTTP/1.1\r\nHost: {own}\r\n\r\n".encode(), False))
    assert final.status == 200 and {r["id"] for r in json.loads(final.text)["runs"]} == created
