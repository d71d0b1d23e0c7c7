"""`laneflow serve`: the HTTP API and the run viewer on this machine, with the routes of the
cloud (laneflow/api.py).

Each HTTP request becomes the API Gateway REST proxy event the cloud would deliver, with the
caller's identity filled in as the local tenant (`svc.settings.tenant`), and is answered by
the same resolver. Since every caller is trusted as that tenant, the server listens on a
loopback address only, and a browser on this machine must not be usable against it by a
page of another site. So, before anything is done:

- the `Host` header must name this server (`127.0.0.1:PORT`, `localhost:PORT`,
  `[::1]:PORT` or the host it was given): a page on a name that resolves here (DNS
  rebinding) gets a 421;
- a POST, PUT, PATCH or DELETE whose `Origin` is another origin, or that the browser marks
  `Sec-Fetch-Site: cross-site` (or `same-site`), is a 403;
- a body is read only when it is labelled `application/json` (UTF-8): anything else, which
  includes every kind of body an HTML form can send, is a 415; a body is at most 1 MiB
  (413) and must be strict JSON (no NaN or Infinity, nested at most 64 deep: 400);
- the whole request (line, headers, body) must arrive within a few seconds: a client that
  stalls or trickles is dropped, on its own thread, while others are answered.

Every refusal is a JSON error `{"message", "problems"}` and does nothing.
"""

from __future__ import annotations

import base64
import errno
import io
import ipaddress
import json
import logging
import re
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

from laneflow.domain import jsonsafe
from laneflow.domain.errors import InvalidInput, LaneflowError
from laneflow.domain.records import RunStatus
from laneflow.entrypoints import api
from laneflow.entrypoints.api import errors as api_errors
from laneflow.ports import Services
from laneflow.wiring import local_drives

log = logging.getLogger("laneflow.serve")


MAX_BODY = 1024 * 1024  # 1 MiB: far above any run's input (a stored record stays under 400 KB)

REQUEST_TIMEOUT_S = 5.0  # the whole request must arrive within this, however it trickles

WRITE_TIMEOUT_S = 10.0  # a reader that stops reading the answer is dropped too

LINGER_S, LINGER_BYTES = 1.0, 2 * MAX_BODY  # what is read and dropped of a refused body

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

METHODS = STATE_CHANGING | {"GET", "HEAD", "OPTIONS"}

STAGE = "local"

_DIGITS = re.compile(r"[0-9]{1,18}")

STREAM_PATH = re.compile(r"/runs/([^/]{1,400})/stream")

STREAM_TICK_S, STREAM_HEARTBEAT_S, STREAM_MAX_S = (
    0.4,
    15.0,
    600.0,
)  # a stream reads the run; a quiet one says so; it closes (and is reopened)


def proxy_event(
    method: str, target: str, headers: list[tuple[str, str]], body: bytes, *, tenant: str, source_ip: str
) -> dict[str, Any]:
    """The API Gateway REST proxy event for one HTTP request, as an IAM caller of `tenant`."""
    path, _, query_text = target.split("#", 1)[0].partition("?")
    path = path or "/"
    query = parse_qs(query_text, keep_blank_values=True)
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        multi_headers.setdefault(name, []).append(value)
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": {name: values[-1] for name, values in multi_headers.items()},
        "multiValueHeaders": multi_headers,
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "accountId": tenant,
            "apiId": "laneflow-serve",
            "httpMethod": method,
            "path": path,
            "protocol": "HTTP/1.1",
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(time.time() * 1000),
            "resourcePath": path,
            "stage": STAGE,
            "identity": {
                "accountId": tenant,
                "sourceIp": source_ip,
                "userAgent": next((v for k, v in headers if k.lower() == "user-agent"), None),
            },
        },
        # As API Gateway passes a body with no binary media type configured: as text.
        "body": body.decode("utf-8", errors="replace") if body else None,
        "isBase64Encoded": False,
    }


# -- what is read ---------------------------------------------------------------------------------


def json_body_problem(body: bytes) -> str | None:
    """Why `body` is not a JSON document this server reads, or None: UTF-8 text that the
    library's strict reader takes (no NaN or Infinity, no number beyond a float's range or
    of too many digits, no lone surrogate, a bounded nesting depth and size)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 text (byte {exc.start} is not)"
    try:
        jsonsafe.parse(text)
    except json.JSONDecodeError as exc:
        return f"the body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    except jsonsafe.Refusal as exc:
        where = f"at {exc.path}" if exc.parts else "as a whole"
        return f"the body is not JSON laneflow takes ({where}): {exc.reason}"
    return None


def _json_media_type(value: str) -> str | None:
    """Why a Content-Type is not JSON this server reads, or None."""
    media, *params = value.split(";")
    if media.strip().lower() != "application/json":
        return f"Content-Type {value.strip()[:100]!r} is not application/json"
    for param in params:
        name, _, given = param.partition("=")
        if name.strip().lower() == "charset" and given.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return f"Content-Type {value.strip()[:100]!r}: only UTF-8 is read"
    return None


class _Deadline(io.RawIOBase):
    """The connection's bytes, read against one deadline per request instead of a timeout
    per read, so a client that trickles a byte at a time is dropped as surely as one that
    stalls."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.at = time.monotonic() + REQUEST_TIMEOUT_S

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


# -- the handler ----------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"
    server_version = "laneflow-serve"

    def setup(self) -> None:
        super().setup()
        self._deadline = _Deadline(self.connection)
        self.rfile = io.BufferedReader(self._deadline)

    def handle_one_request(self) -> None:
        self._deadline.at = time.monotonic() + self.server.request_timeout_s
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.command not in METHODS:
            self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command[:20]!r} is not answered here")
            return False
        return True

    def _answer(self) -> None:
        length, refusal = self.server.refusal(self.command, self.path, self.headers)
        if refusal:
            self._refuse(*refusal, unread=True)
            return
        body = self.rfile.read(length) if length else b""
        if len(body) < length:  # the client closed mid-body: nobody to answer
            self.close_connection = True
            return
        if body and (problem := json_body_problem(body)):
            self._refuse(400, problem, problems=[{"in": "body", "field": None, "message": problem}])
            return
        svc = self.server.svc
        if self.command == "GET" and (streamed := STREAM_PATH.fullmatch(self.path.split("?", 1)[0])):
            self._stream(unquote(streamed.group(1)))
            return
        # HEAD is answered as GET without its body (_reply leaves it out), as HTTP expects.
        event = proxy_event(
            "GET" if self.command == "HEAD" else self.command,
            self.path,
            list(self.headers.items()),
            body,
            tenant=svc.settings.tenant,
            source_ip=self.client_address[0],
        )
        try:
            out = api.resolve(event, None, svc)
        except Exception:  # the resolver answers its own errors; this is a last resort
            log.exception("laneflow serve: a request failed unexpectedly")
            self._refuse(500, api.GENERIC_ERROR)
            return
        payload = out.get("body") or ""
        data = base64.b64decode(payload) if out.get("isBase64Encoded") else payload.encode("utf-8")
        headers = out.get("multiValueHeaders") or {k: [v] for k, v in (out.get("headers") or {}).items()}
        self._reply(out["statusCode"], headers, data)

    def _stream(self, run_id: str) -> None:
        """`GET /runs/{id}/stream`: the run record as server-sent events (`event: run`, its
        JSON as `GET /runs/{id}` answers it), sent again whenever it changes, then `event: end`
        once the run has ended. A comment line keeps a quiet stream open; after STREAM_MAX_S the
        stream closes and the browser's EventSource reconnects. Only `laneflow serve` streams
        (API Gateway's REST APIs cannot): the viewer polls where this is a 404."""
        svc, tenant = self.server.svc, self.server.svc.settings.tenant
        if not 1 <= len(run_id) <= 128:  # as the API's routes take a run id
            self._refuse(
                400,
                "a run id is 1 to 128 characters",
                problems=[{"in": "path", "field": "run_id", "message": "1 to 128 characters"}],
            )
            return
        try:
            run = svc.store.get_run(tenant, run_id)
        except LaneflowError as exc:  # answered as the API answers it (no such run: a 404)
            answer = api_errors.domain_error(exc, svc)
            body = answer.body if isinstance(answer.body, dict) else {}
            self._refuse(answer.status_code, str(body.get("message") or api.GENERIC_ERROR), problems=body.get("problems"))
            return
        self.close_connection = True  # an event stream has no length: it ends with the connection
        self.connection.settimeout(WRITE_TIMEOUT_S)
        self.send_response(200)
        for name, value in (
            ("Content-Type", "text/event-stream; charset=utf-8"),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("Connection", "close"),
        ):
            self.send_header(name, value)
        self.end_headers()
        opened = quiet = time.monotonic()
        sent = None
        try:
            self.wfile.write(b"retry: 2000\n\n")
            while not self.server.stopping.is_set() and time.monotonic() - opened < STREAM_MAX_S:
                record = json.dumps(run.public(), separators=(",", ":"))
                if record != sent:
                    self.wfile.write(f"event: run\ndata: {record}\n\n".encode())
                    sent, quiet = record, time.monotonic()
                if run.status in (RunStatus.completed, RunStatus.failed):
                    self.wfile.write(f'event: end\ndata: "{run.status}"\n\n'.encode())
                    return
                if time.monotonic() - quiet > STREAM_HEARTBEAT_S:
                    self.wfile.write(b": still here\n\n")
                    quiet = time.monotonic()
                self.wfile.flush()
                self.server.stopping.wait(STREAM_TICK_S)
                run = svc.store.get_run(tenant, run_id)
        except OSError:  # the browser went away (or stopped reading): nothing to answer
            return

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _answer

    def _refuse(self, status: int, message: str, *, unread: bool = False, problems: list[dict[str, Any]] | None = None) -> None:
        """Answer a JSON error. `unread`: the request may have more bytes (a body) that were
        not read; they would be taken for the next request, so the connection is closed."""
        if unread:
            self.close_connection = True
        body = json.dumps({"message": message, "problems": problems or []}).encode()
        self._reply(status, {"Content-Type": ["application/json"]}, body)
        if unread:
            self._linger()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, too many headers), as JSON."""
        if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code = HTTPStatus.BAD_REQUEST  # a 5xx says the server failed; this is the client's
        self.log_error("code %d, message %s", code, message)
        self._refuse(int(code), message or self.responses.get(code, ("refused",))[0], unread=True)

    def _reply(self, status: int, headers: dict[str, list[str]], data: bytes) -> None:
        self.connection.settimeout(WRITE_TIMEOUT_S)
        if getattr(self, "request_version", "") == "HTTP/0.9":
            # What a malformed request line leaves; HTTP/0.9 would answer without a status.
            self.request_version = "HTTP/1.0"
        self.send_response(status)
        for name, values in headers.items():
            if name.lower() not in ("content-length", "connection"):
                for value in values:
                    self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(data)

    def _linger(self) -> None:
        """After refusing a request whose body was not read: say we are done, then read and
        drop what the client still sends for a moment, so that closing the connection does
        not reset it before the client has read the refusal."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self._deadline.at = time.monotonic() + LINGER_S
            dropped = 0
            while dropped < LINGER_BYTES and (chunk := self.rfile.read1(65536)):
                dropped += len(chunk)
        except OSError:  # reset, timed out: the connection is being closed anyway
            pass

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


class ApiServer(ThreadingHTTPServer):
    """The local API server. `serve_forever()` answers, one thread per connection;
    `shutdown()` then `server_close()` stop it."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, svc: Services, host: str, port: int, *, quiet: bool = False, request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.svc, self.quiet, self.request_timeout_s = svc, quiet, request_timeout_s
        self.stopping = threading.Event()  # set by shutdown(): open event streams end
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
        bound = self.server_address[1]
        # What a client puts in Host for this server; the port may be left out only when it is 80.
        self.hosts = frozenset(f"{name.lower()}:{bound}" for name in names) | (
            frozenset(n.lower() for n in names) if bound == 80 else frozenset()
        )
        self.origins = frozenset(f"http://{h}" for h in self.hosts)

    def shutdown(self) -> None:
        self.stopping.set()
        super().shutdown()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def refusal(self, method: str, target: str, headers: Any) -> tuple[int, tuple[int, str] | None]:
        """(the body's length, and (status, message) when the request is refused before its
        body is read): not for this host, cross-site, or a body this server does not read."""
        lengths = {value.strip() for value in headers.get_all("Content-Length") or []}
        length_ok = len(lengths) <= 1 and all(_DIGITS.fullmatch(value) for value in lengths)
        length = int(next(iter(lengths))) if lengths and length_ok else 0
        hosts = headers.get_all("Host") or []
        if len(hosts) != 1:
            return length, (400, "send one Host header naming this server")
        if hosts[0].strip().lower() not in self.hosts:
            return length, (421, f"this server answers only for its own host ({self.url}), not Host {hosts[0].strip()[:100]!r}")
        if not target.startswith("/"):
            return length, (400, "the request target must be a path on this server")
        if method in STATE_CHANGING:
            origin = headers.get("Origin")
            if origin is not None and origin.strip().lower() not in self.origins:
                return length, (403, f"cross-site request refused: Origin {origin.strip()[:100]!r} is not {self.url}")
            site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
            if site in ("cross-site", "same-site"):
                return length, (403, f"cross-site request refused (Sec-Fetch-Site: {site})")
        if headers.get("Transfer-Encoding") is not None:
            return length, (411, "send the body whole, with a Content-Length (chunked bodies are not read)")
        if not length_ok:
            return length, (400, "Content-Length must be one number of bytes")
        if length > MAX_BODY:
            return length, (413, f"the body is {length} bytes; at most {MAX_BODY} (1 MiB) is read")
        content_type = headers.get("Content-Type")
        # A form can send only these three types, and each is refused even without a body,
        # so an old browser that sends no Origin cannot post one here either.
        if length or (method in STATE_CHANGING and content_type is not None):
            problem = _json_media_type(content_type) if content_type is not None else "the body has no Content-Type"
            if problem:
                return length, (415, f"{problem}: send JSON with Content-Type: application/json")
        return length, None

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer is no error of ours; anything else is logged
        # (not printed over the terminal's progress as a bare traceback).
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        log.exception("laneflow serve: a connection from %s failed", client_address[0] if client_address else "?")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(
    svc: Services, host: str = "127.0.0.1", port: int = 8080, *, quiet: bool = True, request_timeout_s: float = REQUEST_TIMEOUT_S
) -> ApiServer:
    """A bound server, not yet answering (call `serve_forever`, e.g. on a thread). Port 0
    picks a free port (see `.url`). Loopback addresses only: every caller is the local tenant.
    A port that cannot be listened on (in use, not permitted) is an `InvalidInput` saying so."""
    if not _loopback(host):
        raise InvalidInput(
            f"laneflow serve listens on a loopback address only (127.0.0.1, ::1, localhost), not {host!r}: "
            "it trusts every caller as the local tenant"
        )
    if not 0 <= port <= 65535:
        raise InvalidInput(f"port {port} is not a TCP port (0 to 65535)")
    try:
        return ApiServer(svc, host, port, quiet=quiet, request_timeout_s=request_timeout_s)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InvalidInput(
                f"port {port} on {host} is in use (another laneflow serve?): stop it, or choose another with --port"
            ) from None
        raise InvalidInput(f"cannot listen on port {port} on {host}: {exc.strerror or type(exc).__name__}") from None


def serve(
    svc: Services, host: str = "127.0.0.1", port: int = 8080, *, server: ApiServer | None = None, catchup_s: float = 3600.0
) -> None:
    """Answer the API and the viewer until interrupted, on `server` if given (already bound),
    else on a new one. Runs started here are driven by the embedded engine on threads of this
    process, unless `svc` already has a drive starter. Every `reconcile_interval_s` (60 s
    unless set) a reconcile re-drives the runs whose worker went away meanwhile (`Reconciling`);
    the one at the start is the caller's (`reconcile_runs`, after the port is bound). Due
    schedules fire every few seconds (`serve_schedules.Scheduling`; back after being down,
    each one's last missed firing at most `catchup_s` old)."""
    from laneflow.entrypoints.serve_schedules import Scheduling

    if svc.drives is None:
        svc.drives = local_drives(svc)
    server = server or make_server(svc, host, port, quiet=False)
    print(f"laneflow serve: {server.url}/ (tenant {svc.settings.tenant!r}); Ctrl-C to stop", file=sys.stderr, flush=True)
    reconciling = Reconciling(svc, svc.settings.reconcile_interval_s).start()
    scheduling = Scheduling(svc, catchup_s=catchup_s).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        scheduling.stop()
        reconciling.stop()
        server.server_close()


def reconcile_runs(svc: Services) -> list[str]:
    """One reconcile pass as `serve` makes it: what crashed runs left behind is settled, and
    every run whose drive is gone (interrupted, never picked up, an answered approval) is
    re-driven on this process's drives. The report's lines, "nothing to reconcile" left out."""
    from laneflow.usecases.reconcile import reconcile
    from laneflow.wiring import liveness

    drives = svc.drives
    if drives is None:
        raise ValueError("serve reconciles with its own drives: set svc.drives first")
    report = reconcile(svc, liveness(), redrive=lambda run: drives.start(run.tenant, run.id))
    return [line for line in report.lines() if line != "nothing to reconcile"]


class Reconciling:
    """`serve`'s periodic reconcile: a daemon thread that runs `reconcile_runs` every
    `interval_s` until stopped, so a run whose worker went away while serve runs (a killed
    `laneflow run`, a sandbox child that died) is re-driven without a person. A pass that
    fails is logged and the next one runs on time. A drive serve is running is its own
    process's, alive, so it is never started twice."""

    def __init__(self, svc: Services, interval_s: float):
        self.svc, self.interval_s = svc, interval_s
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="laneflow-reconcile", daemon=True)
        self.passes = 0

    def start(self) -> Reconciling:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                for line in reconcile_runs(self.svc):
                    print(f"laneflow serve: reconcile: {line}", file=sys.stderr, flush=True)
            except Exception:  # the next pass tries again
                log.exception("laneflow serve: a periodic reconcile failed")
            self.passes += 1
