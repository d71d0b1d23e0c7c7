"""The egress proxy on its own (adapters/executors/egress_proxy.py), against tiny servers on
127.0.0.1: a listed destination passes (a plain request and a CONNECT tunnel), any other
gets a 403 and is never connected to, a request that is not a proxy request gets a 400;
an attempt records each refused destination once, at most MAX_REFUSALS times; closing the
proxy ends its tunnels. Every probe targets loopback only."""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Sink, wait_for
from network_servers import Listener, http_server, raw_listener

from laneflow.adapters.executors import egress_forward, egress_proxy
from laneflow.adapters.executors.egress_proxy import EgressProxy, StepNetwork, one_request_s, start_proxy
from laneflow.adapters.executors.isolation import SUBPROCESS
from laneflow.domain.network import Allowlist


@pytest.fixture
def ports() -> Iterator[tuple[int, int]]:
    with http_server() as one, http_server() as two:
        yield one, two


def fetch(url: str, proxy: EgressProxy | str) -> tuple[int, str]:
    through = proxy if isinstance(proxy, str) else proxy.url
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": through}))
    try:
        with opener.open(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def exchange(proxy: EgressProxy, request: bytes) -> tuple[socket.socket, bytes]:
    """Send `request` to the proxy; the socket and the head of its answer."""
    assert proxy.address is not None
    conn = socket.create_connection(proxy.address, timeout=10)
    conn.sendall(request)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = conn.recv(4096)
        if not chunk:
            break
        answer += chunk
    return conn, answer


def test_a_listed_destination_passes_and_another_is_refused_with_a_403(ports: tuple[int, int]) -> None:
    one, two = ports
    with start_proxy([f"127.0.0.1:{one}"]) as proxy:
        assert fetch(f"http://127.0.0.1:{one}/fine", proxy) == (200, f"hello from {one} /fine\n")
        code, said = fetch(f"http://127.0.0.1:{two}/no", proxy)
        assert code == 403 and "not in this step's network: list" in said
        assert fetch(f"http://127.0.0.1:{two}/again", proxy)[0] == 403
        assert proxy.refused() == [("127.0.0.1", two)]  # each destination once


def test_a_refused_destination_is_never_connected_to() -> None:
    with raw_listener() as refused, start_proxy(["127.0.0.1:1"]) as proxy:
        conn, answer = exchange(proxy, f"CONNECT 127.0.0.1:{refused.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        conn.close()
        assert answer.startswith(b"HTTP/1.1 403 ")
        assert refused.waiting() == 0  # nothing reached the listener's queue


def test_connect_to_a_listed_destination_tunnels(ports: tuple[int, int]) -> None:
    one, _ = ports
    with start_proxy([f"127.0.0.1:{one}"]) as proxy:
        conn, answer = exchange(proxy, f"CONNECT 127.0.0.1:{one} HTTP/1.1\r\nHost: 127.0.0.1:{one}\r\n\r\n".encode())
        assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n"
        conn.sendall(b"GET /tunnelled HTTP/1.0\r\nHost: x\r\n\r\n")
        said = b""
        while chunk := conn.recv(4096):
            said += chunk
        conn.close()
        assert said.startswith(b"HTTP/1.0 200") and said.endswith(f"hello from {one} /tunnelled\n".encode())


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /origin-form HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
        b"nonsense\r\n\r\n",
    ],
)
def test_what_is_not_a_proxy_request_gets_a_400(request_head: bytes) -> None:
    with start_proxy(["127.0.0.1"]) as proxy:
        conn, answer = exchange(proxy, request_head)
        conn.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer


def test_closing_the_proxy_ends_its_tunnels(ports: tuple[int, int]) -> None:
    one, _ = ports
    proxy = start_proxy([f"127.0.0.1:{one}"])
    conn, answer = exchange(proxy, f"CONNECT 127.0.0.1:{one} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200 ")
    proxy.close()
    assert conn.recv(10) == b""  # the tunnel's end, not a wait
    conn.close()


def test_one_request_is_timed_through_the_proxy_and_directly(ports: tuple[int, int]) -> None:
    one, two = ports
    with start_proxy([f"127.0.0.1:{one}"]) as proxy:
        assert one_request_s(f"http://127.0.0.1:{one}/", proxy=proxy) > 0
        assert one_request_s(f"http://127.0.0.1:{two}/") > 0
        with pytest.raises(urllib.error.HTTPError, match="403"):
            one_request_s(f"http://127.0.0.1:{two}/", proxy=proxy)


def test_an_attempt_records_each_refusal_once_and_at_most_max_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress_proxy, "MAX_REFUSALS", 3)
    sink = Sink()
    network = StepNetwork(["127.0.0.1:1"], sink)
    for ports in ([2, 3, 2], [3, 4, 5, 6]):  # two program runs of one attempt
        served = network.start(SUBPROCESS, None)
        assert served is not None and served.prefix == [] and served.bwrap_args == []  # no namespace: on the host's loopback
        for port in ports:
            assert fetch(f"http://127.0.0.1:{port}/", served.env["HTTP_PROXY"])[0] == 403
        network.stop()
    assert [data for _, _, data in sink.events] == [{"host": "127.0.0.1", "port": p, "refused": True} for p in (2, 3, 4)]
    assert {kind for kind, _, _ in sink.events} == {"warning"} and "the last refusal" in sink.events[-1][1]


def test_a_step_without_a_list_runs_no_proxy() -> None:
    network = StepNetwork([], Sink())
    assert network.start(SUBPROCESS, None) is None and network.data() == "none"
    network.stop()


def test_the_listener_helper_counts_what_reached_it() -> None:
    with raw_listener() as listener:
        socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()
        assert listener.waiting() == 1
    assert isinstance(listener, Listener)


def _port_is_free(port: int) -> bool:
    """Nothing listens on it (connections of it left in TIME_WAIT do not count)."""
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_forwarder_relays_to_the_proxys_socket_then_execs_its_program_and_leaves_after_it(ports: tuple[int, int]) -> None:
    one, two = ports
    folder = tempfile.mkdtemp(prefix="laneflow-forward-test-")  # short enough for a socket's path
    try:
        with EgressProxy(Allowlist.parse([f"127.0.0.1:{one}"])) as proxy:
            path = proxy.listen_unix(f"{folder}/egress.sock")
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()
            source = Path(egress_forward.__file__).read_text()
            curl = ["curl", "-sS", "--max-time", "10", "-x", f"http://127.0.0.1:{port}", "-w", " %{http_code}"]
            script = (
                f"{shlex.join([*curl, f'http://127.0.0.1:{one}/via'])}; echo; {shlex.join([*curl, f'http://127.0.0.1:{two}/'])}"
            )
            argv = [sys.executable, "-I", "-S", "-c", source, path, str(port), "--", "sh", "-c", script]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            assert done.stdout == f"hello from {one} /via\n 200\n127.0.0.1:{two} is not in this step's network: list\n 403"
            assert proxy.refused() == [("127.0.0.1", two)]
        # Outside a sandbox's pid namespace the relay leaves by itself once its program is gone.
        wait_for(lambda: _port_is_free(port), "the relay to leave after its program", timeout_s=15)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
