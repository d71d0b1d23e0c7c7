"""Tiny servers on 127.0.0.1 (a free port each) for the network allowlist's tests: an HTTP
server that answers `hello from <port> <path>` (`/bytes/N`: N bytes of BYTE_PATTERN; a POST:
the sha256 of its body), and a raw listener that accepts nothing and counts what reached
its queue."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BYTE_PATTERN = bytes(range(256))


def pattern(n: int) -> bytes:
    return (BYTE_PATTERN * (n // 256 + 1))[:n]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/bytes/"):
            self._send(pattern(int(self.path.removeprefix("/bytes/"))))
        else:
            self._send(f"hello from {self.server.server_address[1]} {self.path}\n".encode())  # type: ignore[index]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(f"{hashlib.sha256(body).hexdigest()}\n".encode())

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def http_server() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 for the block; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class Listener:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])

    def waiting(self) -> int:
        """How many connections reached its queue (taken from it)."""
        self.sock.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@contextmanager
def raw_listener() -> Iterator[Listener]:
    listener = Listener()
    try:
        yield listener
    finally:
        listener.sock.close()
