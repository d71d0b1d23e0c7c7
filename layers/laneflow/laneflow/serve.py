"""`laneflow serve`: the HTTP API and the run viewer on this machine, with the routes of the
cloud (laneflow/api.py).

Each HTTP request becomes the API Gateway REST proxy event the cloud would deliver, with the
caller's identity filled in as the local tenant (`svc.settings.tenant`), and is answered by
the same resolver. Since every caller is trusted as that tenant, the server listens on a
loopback address only.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import api
from .errors import InvalidInput
from .services import Services

MAX_BODY = 10 * 1024 * 1024  # what API Gateway accepts
STAGE = "local"


def proxy_event(
    method: str, target: str, headers: list[tuple[str, str]], body: bytes, *, tenant: str, source_ip: str
) -> dict[str, Any]:
    """The API Gateway REST proxy event for one HTTP request, as an IAM caller of `tenant`."""
    url = urlsplit(target)
    path = url.path or "/"
    query = parse_qs(url.query, keep_blank_values=True)
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
            "identity": {"accountId": tenant, "sourceIp": source_ip, "userAgent": next((v for k, v in headers if k.lower() == "user-agent"), None)},
        },
        # As API Gateway passes a body with no binary media type configured: as text.
        "body": body.decode("utf-8", errors="replace") if body else None,
        "isBase64Encoded": False,
    }


class _Handler(BaseHTTPRequestHandler):
    server: "ApiServer"
    protocol_version = "HTTP/1.1"
    server_version = "laneflow-serve"

    def _answer(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") or not 0 <= length <= MAX_BODY:
            # What is left of a body it cannot read would be taken for the next request.
            self.close_connection = True
            self._refuse(413 if length > MAX_BODY else 400, "send the body whole, with a Content-Length of at most 10 MB")
            return
        body = self.rfile.read(length) if length else b""
        svc = self.server.svc
        event = proxy_event(
            self.command, self.path, list(self.headers.items()), body, tenant=svc.settings.tenant, source_ip=self.client_address[0]
        )
        out = api.resolve(event, None, svc)
        payload = out.get("body") or ""
        data = base64.b64decode(payload) if out.get("isBase64Encoded") else payload.encode("utf-8")
        headers = out.get("multiValueHeaders") or {k: [v] for k, v in (out.get("headers") or {}).items()}
        self._reply(out["statusCode"], headers, data)

    def _refuse(self, status: int, message: str) -> None:
        self._reply(status, {"Content-Type": ["application/json"]}, json.dumps({"message": message, "problems": []}).encode())

    def _reply(self, status: int, headers: dict[str, list[str]], data: bytes) -> None:
        self.send_response(status)
        for name, values in headers.items():
            if name.lower() != "content-length":
                for value in values:
                    self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _answer

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


class ApiServer(ThreadingHTTPServer):
    """The local API server. `serve_forever()` answers; `shutdown()` then `server_close()` stop it."""

    daemon_threads = True

    def __init__(self, svc: Services, host: str, port: int, *, quiet: bool = False):
        self.svc, self.quiet = svc, quiet
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(svc: Services, host: str = "127.0.0.1", port: int = 8080, *, quiet: bool = True) -> ApiServer:
    """A bound server, not yet answering (call `serve_forever`, e.g. on a thread). Port 0
    picks a free port (see `.url`). Loopback addresses only: every caller is the local tenant."""
    if not _loopback(host):
        raise InvalidInput(
            f"laneflow serve listens on a loopback address only (127.0.0.1, ::1, localhost), not {host!r}: "
            "it trusts every caller as the local tenant"
        )
    return ApiServer(svc, host, port, quiet=quiet)


def serve(svc: Services, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Answer the API and the viewer until interrupted. Runs started here are driven by the
    embedded engine on threads of this process, unless `svc` already has a drive starter."""
    if svc.drives is None:
        from .engine.local import LocalDrives  # the engine (moto) is loaded only to serve

        svc.drives = LocalDrives(svc)
    server = make_server(svc, host, port, quiet=False)
    print(f"laneflow serve: {server.url}/ (tenant {svc.settings.tenant!r}); Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
