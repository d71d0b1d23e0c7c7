"""`laneflow serve`: the HTTP API (laneflow/api.py) over real HTTP on 127.0.0.1, answering the
same routes as the Lambda handler for the local tenant, streaming a run as server-sent events,
and serving concurrent callers."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from api_calls import START, api_services
from helpers import started_drives

from laneflow.domain.errors import InvalidInput
from laneflow.entrypoints.serve import make_server
from laneflow.ports import Services


@pytest.fixture
def api_svc(svc: Services) -> Services:
    return api_services(svc)


# -- laneflow serve ------------------------------------------------------------------------------


def http(
    base: str, method: str, path: str, body: Any = None, raw: bytes | None = None, content_type: str | None = "application/json"
) -> tuple[int, Any, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    # Without a content type, urllib labels a body as a form (as `curl -d` does).
    sent = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(base + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, headers, text = response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        status, headers, text = error.code, error.headers, error.read().decode()
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
    assert started_drives(api_svc) == [("local", run["id"])]

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
    assert len(started_drives(api_svc)) == 4


def test_laneflow_serve_listens_on_loopback_only(api_svc: Services) -> None:
    with pytest.raises(InvalidInput, match="loopback"):
        make_server(api_svc, "0.0.0.0", 0)
