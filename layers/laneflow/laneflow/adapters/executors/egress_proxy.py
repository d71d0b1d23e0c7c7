"""The egress proxy: how a sandboxed step's programs reach exactly the destinations its
agent.md `network:` lists (domain/network.py), and nothing else.

laneflow runs the proxy itself, outside the sandbox, while each program runs: an HTTP
forward proxy that takes plain requests (`GET http://host:port/path`) and CONNECT tunnels
(TLS stays end to end). A destination the list allows is connected to; any other gets a 403
and is recorded, and the proxy never opens a connection to it. The programs are handed it
as HTTP_PROXY / HTTPS_PROXY (and the lower-case forms).

How a program in bubblewrap reaches it. The sandbox has its own network namespace (no
route out, only its own loopback), so nothing listening on the host is reachable from it.
The proxy listens on a Unix socket in a 0700 folder of its own, owned by the sandbox's uid
(where the engine's callback relay lives too: the host's temp folder), and that socket
alone is bound into the sandbox (`--ro-bind`, at SOCKET_IN_SANDBOX). Clients speak TCP to a
proxy, not Unix sockets, so before the program the sandbox's own python3 runs a forwarder
(egress_forward.py, handed as `-c` source: laneflow's own files are not in the sandbox)
that listens on 127.0.0.1:FORWARD_PORT in the sandbox's namespace, relays each connection to
the socket, and execs the program. Chosen over the alternatives because it keeps the fence
whole: a veth pair or slirp4netns would give the sandbox a route (and need privileges or
another program), and a TCP port on the host is not reachable from inside the namespace.
A program that ignores the variables reaches nothing: the namespace has no route out.

Under the plain-subprocess fallback (no network namespace) the proxy listens on
127.0.0.1 on the host, for programs that use it; nothing stops one that does not, the trace
says so, and `network_enforce: true` refuses the step. In the cloud the Fargate task runs
the same proxy in-process (the sandbox worker is this code), and its security group lets
the task reach ports 80 and 443 only (docs/CHOICES.md).

`start_proxy` starts one from Python (what a benchmark measures), `one_request_s` times
one request with or without it.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from laneflow.adapters.executors import egress_forward
from laneflow.adapters.executors.isolation import BUBBLEWRAP, Isolation
from laneflow.adapters.executors.sandbox_user import PATH
from laneflow.domain.network import Allowlist, normal_host
from laneflow.domain.records import EventType
from laneflow.ports import ExecutionSink

FORWARD_PORT = 3128  # in the sandbox's own namespace: nothing else listens there

SOCKET_IN_SANDBOX = "/run/laneflow/egress.sock"

MAX_HEAD_BYTES = 65_536  # a request's line and headers

HEAD_TIMEOUT_S = 30.0

CONNECT_TIMEOUT_S = 10.0

MAX_REFUSALS = 100  # refusal events an attempt records (each destination once)

_SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/opt/")

_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "upgrade"}


class _Refused(Exception):
    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status = status


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """(the request's line and headers, what came after them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise _Refused("431 Request Header Fields Too Large", "the request's headers are too large")
        chunk = conn.recv(8192)
        if not chunk:
            raise _Refused("400 Bad Request", "the request ended before its headers")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _split_authority(authority: str) -> tuple[str, int]:
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise _Refused("400 Bad Request", f"CONNECT takes host:port, not {authority!r}")
    return host.strip("[]"), int(port)


def _plain_request(lines: list[str], method: str, target: str, version: str) -> tuple[str, int, bytes]:
    """A plain request's destination and the head sent on (origin form, one request)."""
    url = urlsplit(target)
    if url.scheme.lower() != "http" or not url.hostname:
        raise _Refused("400 Bad Request", "a plain request names its http:// URL (https goes through CONNECT)")
    try:
        port = url.port or 80
    except ValueError:
        raise _Refused("400 Bad Request", "the URL's port is not a port") from None
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [line for line in lines[1:] if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
    head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
    return url.hostname, port, head.encode("latin-1")


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until each side has sent its end."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65_536):
                dst.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=copy, args=(b, a), name="laneflow-egress-back", daemon=True)
    back.start()
    copy(a, b)
    back.join()


class EgressProxy:
    """One running proxy: `listen_unix` / `listen_tcp` open where clients reach it; `close`
    ends it and every connection through it. `refused()` is each destination it refused, in
    order, once."""

    def __init__(self, allowlist: Allowlist, *, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.allowlist = allowlist
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._servers: list[socket.socket] = []
        self._live: set[socket.socket] = set()
        self._refused: list[tuple[str, int]] = []
        self._closed = False
        self.address: tuple[str, int] | None = None  # its TCP address, once listening there

    @property
    def url(self) -> str:
        assert self.address is not None, "not listening on TCP"
        return f"http://{self.address[0]}:{self.address[1]}"

    def listen_unix(self, path: str) -> str:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._serving(server):
            server.bind(path)
            Path(path).chmod(0o600)
        return path

    def listen_tcp(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with self._serving(server):
            server.bind((host, port))
        self.address = server.getsockname()[:2]
        return self.address

    @contextlib.contextmanager
    def _serving(self, server: socket.socket) -> Iterator[None]:
        """Serve on `server` once the block has bound it (closed, when it fails)."""
        try:
            yield
            server.listen(64)
        except OSError:
            server.close()
            raise
        with self._lock:
            self._servers.append(server)
        threading.Thread(target=self._accept, args=(server,), name="laneflow-egress", daemon=True).start()

    def refused(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._refused)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers, live = list(self._servers), list(self._live)
        for sock in servers + live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, server: socket.socket) -> None:
        while not self._closed:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), name="laneflow-egress-conn", daemon=True).start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._live.add(sock)
            return True

    def _handle(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            if not self._track(conn):
                return
            conn.settimeout(HEAD_TIMEOUT_S)
            head, rest = _read_head(conn)
            upstream, first = self._open(head)
            if first is None:  # CONNECT: the tunnel is open
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = b""
            upstream.sendall(first + rest)
            conn.settimeout(None)
            upstream.settimeout(None)
            _splice(conn, upstream)
        except _Refused as refused:
            body = f"{refused}\n".encode()
            with contextlib.suppress(OSError):
                conn.sendall(
                    f"HTTP/1.1 {refused.status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + body
                )
        except OSError:
            pass
        finally:
            for sock in (conn, upstream):
                if sock is not None:
                    with self._lock:
                        self._live.discard(sock)
                    with contextlib.suppress(OSError):
                        sock.close()

    def _open(self, head: bytes) -> tuple[socket.socket, bytes | None]:
        """The connection to the request's destination, if the list allows it, and the
        head to send on (None for a CONNECT tunnel)."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _Refused("400 Bad Request", "not an HTTP request")
        method, target, version = parts
        if method.upper() == "CONNECT":
            host, port = _split_authority(target)
            first: bytes | None = None
        else:
            host, port, first = _plain_request(lines, method, target, version)
        if not self.allowlist.allows(host, port):
            self._refuse(host, port)
            raise _Refused("403 Forbidden", f"{host}:{port} is not in this step's network: list")
        try:
            upstream = socket.create_connection((host, port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise _Refused("502 Bad Gateway", f"{host}:{port} could not be reached: {exc.strerror or exc}") from None
        if not self._track(upstream):
            upstream.close()
            raise _Refused("503 Service Unavailable", "the proxy is closing")
        return upstream, first

    def _refuse(self, host: str, port: int) -> None:
        destination = (normal_host(host), port)
        with self._lock:
            if destination not in self._refused and len(self._refused) < 10 * MAX_REFUSALS:
                self._refused.append(destination)


def start_proxy(allowed: Iterable[str], *, host: str = "127.0.0.1", port: int = 0) -> EgressProxy:
    """An egress proxy allowing `allowed` (as agent.md `network:` lists them), listening on
    `host:port` (0: a free port); its `url` is what HTTP_PROXY would say. Close it (or use
    it as a context manager) when done."""
    proxy = EgressProxy(Allowlist.parse(allowed))
    proxy.listen_tcp(host, port)
    return proxy


def one_request_s(url: str, *, proxy: EgressProxy | None = None, timeout_s: float = 10.0) -> float:
    """The seconds one GET of `url` takes to its last byte, through `proxy` or directly."""
    handler = urllib.request.ProxyHandler({"http": proxy.url, "https": proxy.url} if proxy else {})
    opener = urllib.request.build_opener(handler)
    started = time.perf_counter()
    with opener.open(url, timeout=timeout_s) as answer:
        answer.read()
    return time.perf_counter() - started


# -- one step's network ----------------------------------------------------------------------


def forwarder_python() -> str | None:
    """The python3 the sandbox runs the forwarder with: one on the programs' PATH that lives
    in the system folders bound into the sandbox (None when there is none)."""
    found = shutil.which("python3", path=PATH)
    if found is None:
        return None
    real = str(Path(found).resolve())
    return found if real.startswith(_SYSTEM_DIRS) else None


@functools.cache
def _forwarder_source() -> str:
    return Path(egress_forward.__file__).read_text(encoding="utf-8")


@dataclass
class Served:
    """What one program run gets of the step's proxy: its variables, the bubblewrap
    arguments that bind the socket in, and the forwarder its argv starts with."""

    env: dict[str, str]
    bwrap_args: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)

    def wrap(self, argv: list[str]) -> list[str]:
        return [*self.prefix, *argv]


def proxy_env(url: str) -> dict[str, str]:
    return {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}


class StepNetwork:
    """One attempt's network: its allowlist, the proxy each program runs beside (`start`,
    `stop`), and its refusals recorded on the step once per destination (at most
    MAX_REFUSALS events)."""

    def __init__(self, entries: Sequence[str], sink: ExecutionSink):
        self.allowlist = Allowlist.parse(entries)
        self.sink = sink
        self._recorded: set[tuple[str, int]] = set()
        self._proxy: EgressProxy | None = None
        self._folder: str | None = None

    def data(self) -> list[str] | str:
        return self.allowlist.texts() if self.allowlist else "none"

    def unavailable(self, isolation: Isolation) -> str | None:
        """Why this machine cannot give the step its list (None when it can)."""
        if self.allowlist and isolation is BUBBLEWRAP and forwarder_python() is None:
            return "its network: list needs a python3 in /usr or /bin for the sandbox's forwarder, and there is none"
        return None

    def start(self, isolation: Isolation, uid: int | None) -> Served | None:
        """The proxy for one program run (None: the step has no network)."""
        if not self.allowlist:
            return None
        proxy = self._proxy = EgressProxy(self.allowlist)
        if isolation is not BUBBLEWRAP:
            proxy.listen_tcp()
            return Served(env=proxy_env(proxy.url))
        base = tempfile.gettempdir()
        self._folder = tempfile.mkdtemp(prefix="laneflow-egress-", dir=base if len(base) <= 60 else "/tmp")
        path = proxy.listen_unix(str(Path(self._folder) / "egress.sock"))
        if uid is not None:  # bubblewrap, run as the sandbox's uid, opens the socket's path
            for owned in (self._folder, path):
                shutil.chown(owned, uid, uid)
        python = forwarder_python() or "python3"
        prefix = [python, "-I", "-S", "-c", _forwarder_source(), SOCKET_IN_SANDBOX, str(FORWARD_PORT), "--"]
        return Served(
            env=proxy_env(f"http://127.0.0.1:{FORWARD_PORT}"), bwrap_args=["--ro-bind", path, SOCKET_IN_SANDBOX], prefix=prefix
        )

    def stop(self) -> None:
        """End the program run's proxy and record what it refused that is new to the attempt."""
        proxy, self._proxy = self._proxy, None
        if proxy is None:
            return
        proxy.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        for host, port in proxy.refused():
            if (host, port) in self._recorded or len(self._recorded) >= MAX_REFUSALS:
                continue
            self._recorded.add((host, port))
            last = " (the last refusal this attempt records)" if len(self._recorded) == MAX_REFUSALS else ""
            self.sink.event(
                EventType.warning,
                f"network: refused {host}:{port}, not in the agent's network: list{last}",
                _refusal(host, port),
            )


def _refusal(host: str, port: int) -> dict[str, Any]:
    return {"host": host, "port": port, "refused": True}
