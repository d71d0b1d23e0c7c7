"""The imitation's HTTP side: a ``ThreadingHTTPServer`` whose handler reads a request's body
(whole or chunked), routes ``GET /stats``, ``POST /stats/reset`` and ``POST /v1/messages``
(to its `MessagesImitation`), answers JSON and the API's error shapes, reads the caller's
key, and watches a connection for the caller giving up."""

from __future__ import annotations

import json
import secrets
import select
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneflow_dev.imitation.server import MessagesImitation

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


ERROR_MESSAGES: dict[int, str] = {
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of request tokens has exceeded your per-minute rate limit (imitation)",
    500: "Internal server error (imitation)",
    529: "Overloaded",
}


def _error_type(status: int) -> str:
    return ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def api_key_of(headers: Any) -> str | None:
    """The caller's key: ``x-api-key``, or an ``Authorization: Bearer`` token (what SDK 2.x
    sends for ``api_key``)."""
    key = (headers.get("x-api-key") or "").strip()
    if key:
        return key
    auth = (headers.get("Authorization") or "").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True
    imitation: MessagesImitation


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "laneflow-imitation"
    sys_version = ""
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing -------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", new_id("req_"))
        self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _send_error(self, status: int, message: str | None = None) -> None:
        headers = {"retry-after": "0"} if status == 429 else None
        payload = {
            "type": "error",
            "error": {"type": _error_type(status), "message": message or ERROR_MESSAGES.get(status, "error")},
        }
        self._send_json(status, payload, headers)

    # -- routes ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/stats":
            self._send_json(200, self.server.imitation.stats())
        else:
            self._send_error(404, f"Not found: {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            raw = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        if path == "/stats/reset":
            self.server.imitation.reset()
            self._send_json(200, self.server.imitation.stats())
        elif path == "/v1/messages":
            self.server.imitation.handle_messages(self, raw)
        else:
            self._send_error(404, f"Not found: {path}")


def client_stays(conn: socket.socket, seconds: float) -> bool:
    """Wait `seconds` (the prefill), watching the connection: False as soon as the client
    closes it, as a server sees a caller give up before the first token."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([conn], [], [], min(left, 0.05))
        if not readable:
            continue
        try:
            if not conn.recv(1, socket.MSG_PEEK):
                return False
        except OSError:
            return False
        time.sleep(min(left, 0.05))  # the client sent something more: not a close
    return True
