"""The server: a ``ThreadingHTTPServer`` on loopback answering ``POST /v1/messages`` with a
whole Message or its server-sent events, keeping the prompt cache and the stats."""

from __future__ import annotations

import json
import math
import re
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from laneflow_dev.imitation.prompt import (
    DEFAULT_MIN_CACHEABLE,
    Prompt,
    RequestError,
    analyze_prompt,
    canonical,
    validate_body,
    validate_output_config,
)
from laneflow_dev.imitation.replies import Reply, Responder, default_responder

HOST = "127.0.0.1"

MAX_KEPT = 1_000  # requests kept in `received`


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


@dataclass
class _Entry:
    tokens: int
    ttl_s: float
    expires_at: float
    readable_at: float | None = None  # set when a writing response begins


@dataclass
class _Plan:
    """What one request does to the cache (decided on arrival)."""

    read_tokens: int = 0
    write_tokens: int = 0
    write_5m: int = 0
    write_1h: int = 0
    written: list[_Entry] = field(default_factory=list)


def _new_counts() -> dict[str, int]:
    return {
        "requests": 0,
        "errors": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_write_tokens": 0,
        "cache_read_tokens": 0,
        "cache_writes": 0,
        "cache_reads": 0,
        "disconnects": 0,  # responses whose client closed the connection before the reply ended
        "held": 0,  # requests whose response headers were held (`hold_headers_ms`)
    }


def _api_key_of(headers: Any) -> str | None:
    """The caller's key: ``x-api-key``, or an ``Authorization: Bearer`` token (what SDK 2.x
    sends for ``api_key``)."""
    key = (headers.get("x-api-key") or "").strip()
    if key:
        return key
    auth = (headers.get("Authorization") or "").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True
    imitation: MessagesImitation


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "laneflow-imitation"
    sys_version = ""
    server: _Server

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
        self.send_header("request-id", _new_id("req_"))
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
            self.server.imitation._handle_messages(self, raw)
        else:
            self._send_error(404, f"Not found: {path}")


class MessagesImitation:
    """A local Messages API with the real prompt-cache semantics. See the module docstring."""

    def __init__(
        self,
        *,
        port: int = 0,
        ttft_ms: int = 0,
        token_ms: float = 0.0,
        hold_headers_ms: int = 0,
        responder: Responder | None = None,
        api_keys: set[str] | None = None,
        ttl_s: float = 300.0,
        min_cacheable: dict[str, int] | None = None,
        chars_per_token: int = 4,
        ttl_1h_s: float = 3600.0,
    ):
        if chars_per_token < 1:
            raise ValueError("chars_per_token must be >= 1")
        if hold_headers_ms < 0:
            raise ValueError("hold_headers_ms must be >= 0")
        self.port = port
        self.ttft_ms = ttft_ms
        self.token_ms = token_ms
        # An accepted request waits this long before its response's status line and headers
        # go out, as behind an overloaded API or a proxy holding the response: the caller has
        # sent everything and has nothing to read yet.
        self.hold_headers_ms = hold_headers_ms
        self.responder: Responder = responder or default_responder
        self.api_keys = set(api_keys) if api_keys is not None else None
        self.ttl_s = ttl_s
        self.ttl_1h_s = ttl_1h_s
        # The given minimums are merged over the documented defaults ("*" sets the fallback).
        self.min_cacheable = {**DEFAULT_MIN_CACHEABLE, **(min_cacheable or {})}
        self.chars_per_token = chars_per_token
        self.url = ""
        self._lock = threading.Lock()
        self._cache: dict[str, _Entry] = {}
        self._fail: list[int] = []
        self._totals = _new_counts()
        self._by_model: dict[str, dict[str, int]] = {}
        self._since_sweep = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # The requests to /v1/messages as they arrived (the last MAX_KEPT): body and headers.
        self.received: list[dict[str, Any]] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> MessagesImitation:
        if self._server is not None:
            return self
        server = _Server((HOST, self.port), _Handler)
        server.imitation = self
        self._server = server
        self.port = server.server_address[1]
        self.url = f"http://{HOST}:{self.port}"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="laneflow-imitation", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MessagesImitation:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- controls -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._totals)
            out["by_model"] = {m: dict(c) for m, c in self._by_model.items()}
            return out

    def reset(self) -> None:
        with self._lock:
            self._cache.clear()
            self._totals = _new_counts()
            self._by_model = {}

    def fail_next(self, *statuses: int) -> None:
        """The next requests to /v1/messages answer these error statuses, in order."""
        with self._lock:
            self._fail.extend(int(s) for s in statuses)

    def min_cacheable_for(self, model: str) -> int:
        best = None
        for prefix in self.min_cacheable:
            if prefix != "*" and model.startswith(prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        return self.min_cacheable[best] if best is not None else self.min_cacheable.get("*", 1024)

    # -- accounting (all under the lock) ----------------------------------------------------

    def _count(self, model: str | None, **deltas: int) -> None:
        buckets = [self._totals]
        if model:
            buckets.append(self._by_model.setdefault(model, _new_counts()))
        for bucket in buckets:
            for k, v in deltas.items():
                bucket[k] += v

    def _entry_ttl(self, ttl: str) -> float:
        return self.ttl_1h_s if ttl == "1h" else self.ttl_s

    def _plan_cache(self, model: str, prompt: Prompt, now: float) -> _Plan:
        """Read the longest readable prefix; write every longer breakpoint (billed once)."""
        plan = _Plan()
        minimum = self.min_cacheable_for(model)
        eligible = [bp for bp in prompt.breakpoints if bp.tokens >= minimum]
        self._since_sweep += 1
        if self._since_sweep >= 256:
            self._since_sweep = 0
            for key in [k for k, e in self._cache.items() if e.expires_at <= now]:
                del self._cache[key]
        for bp in reversed(eligible):
            entry = self._cache.get(bp.key)
            if entry is None:
                continue
            if entry.expires_at <= now:
                del self._cache[bp.key]
                continue
            if entry.readable_at is not None and entry.readable_at <= now:
                entry.ttl_s = max(entry.ttl_s, self._entry_ttl(bp.ttl))
                entry.expires_at = now + entry.ttl_s
                plan.read_tokens = bp.tokens
                break
        covered = plan.read_tokens
        for bp in eligible:
            if bp.tokens <= covered:
                continue
            ttl_s = self._entry_ttl(bp.ttl)
            entry = self._cache.get(bp.key)
            if entry is None or entry.expires_at <= now:
                entry = _Entry(tokens=bp.tokens, ttl_s=ttl_s, expires_at=now + ttl_s)
                self._cache[bp.key] = entry
            else:  # pending: another response is writing it too; this one pays again
                entry.ttl_s = max(entry.ttl_s, ttl_s)
                entry.expires_at = now + entry.ttl_s
            plan.written.append(entry)
            segment = bp.tokens - covered
            if bp.ttl == "1h":
                plan.write_1h += segment
            else:
                plan.write_5m += segment
            covered = bp.tokens
        plan.write_tokens = covered - plan.read_tokens
        return plan

    def _begin(self, plan: _Plan) -> None:
        """The response begins: what it wrote becomes readable."""
        if not plan.written:
            return
        with self._lock:
            now = time.monotonic()
            for entry in plan.written:
                if entry.readable_at is None:
                    entry.readable_at = now

    # -- the endpoint ---------------------------------------------------------------------

    def _handle_messages(self, h: _Handler, raw: bytes) -> None:
        model: str | None = None
        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            model = body["model"]

        def fail(status: int, message: str | None = None) -> None:
            with self._lock:
                self._count(model, requests=1, errors=1)
            h._send_error(status, message)

        with self._lock:
            forced = self._fail.pop(0) if self._fail else None
        if forced is not None:
            fail(forced)
            return
        key = _api_key_of(h.headers)
        if not key or (self.api_keys is not None and key not in self.api_keys):
            fail(401, "invalid x-api-key")
            return
        if body is None:
            fail(400, "Request body is not valid JSON")
            return
        betas = {b.strip() for b in (h.headers.get("anthropic-beta") or "").split(",") if b.strip()}
        with self._lock:
            self.received.append({"body": body, "betas": sorted(betas)})
            del self.received[:-MAX_KEPT]
        if not self._hold_headers(h, model):
            return  # the caller gave up before a byte of the response: nothing is sent
        try:
            validate_body(body)
            validate_output_config(body, betas)
            prompt = analyze_prompt(body, self.chars_per_token)
        except RequestError as e:
            fail(e.status, e.message)
            return
        assert model is not None  # validate_body found body["model"] a string
        try:
            reply = self.responder(body)
        except Exception as e:  # a responder's bug answers a 500, like a server error
            fail(500, f"responder failed: {e!r}")
            return

        blocks, stop_reason, output_tokens = self._render(reply, body["max_tokens"])
        with self._lock:
            plan = self._plan_cache(model, prompt, time.monotonic())
            input_tokens = prompt.tokens - plan.read_tokens - plan.write_tokens
            self._count(
                model,
                requests=1,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cache_write_tokens=plan.write_tokens,
                cache_read_tokens=plan.read_tokens,
                cache_writes=1 if plan.write_tokens else 0,
                cache_reads=1 if plan.read_tokens else 0,
            )
        usage = {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": plan.write_tokens,
            "cache_read_input_tokens": plan.read_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": plan.write_5m,
                "ephemeral_1h_input_tokens": plan.write_1h,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }
        message: dict[str, Any] = {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        if body.get("stream"):
            self._stream(h, plan, message, blocks, stop_reason, output_tokens)
        else:
            self._whole(h, plan, message, blocks, stop_reason, output_tokens)

    def _whole(
        self,
        h: _Handler,
        plan: _Plan,
        message: dict[str, Any],
        blocks: list[tuple[dict[str, Any], list[str]]],
        stop_reason: str,
        output_tokens: int,
    ) -> None:
        """The reply as one Message, after the prefill and the output's time."""
        if self.ttft_ms:
            time.sleep(self.ttft_ms / 1000.0)
        self._begin(plan)
        if self.token_ms:
            time.sleep(self.token_ms * output_tokens / 1000.0)
        message["content"] = [b for b, _ in blocks]
        message["stop_reason"] = stop_reason
        h._send_json(200, message)

    def _hold_headers(self, h: _Handler, model: str | None) -> bool:
        """Hold the response's headers `hold_headers_ms` (if set), watching the connection:
        False (counted as a disconnect) as soon as the caller closes it."""
        if not self.hold_headers_ms:
            return True
        with self._lock:
            self._count(model, held=1)
        if _client_stays(h.connection, self.hold_headers_ms / 1000.0):
            return True
        with self._lock:
            self._count(model, disconnects=1)
        h.close_connection = True
        return False

    def _tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    def _render(self, reply: Reply, max_tokens: int) -> tuple[list[tuple[dict[str, Any], list[str]]], str, int]:
        """The reply's content blocks, each with its delta pieces; its stop reason; its
        output tokens (cut at max_tokens)."""
        blocks: list[tuple[dict[str, Any], list[str]]] = []
        budget = max_tokens
        text = reply.text or ""
        truncated = False
        if self._tokens(text) > budget:
            text = text[: budget * self.chars_per_token]
            truncated = True
        used = self._tokens(text)
        if text or not reply.tool_uses:
            blocks.append(({"type": "text", "text": text}, _word_chunks(text)))
        if not truncated:
            for call in reply.tool_uses:
                name = str(call.get("name", "tool"))
                tool_input = call.get("input") or {}
                cost = self._tokens(name + canonical(tool_input))
                if used + cost > budget:
                    truncated = True
                    break
                used += cost
                raw = json.dumps(tool_input)
                pieces = [""] + [raw[i : i + 16] for i in range(0, len(raw), 16)]
                block = {"type": "tool_use", "id": call.get("id") or _new_id("toolu_"), "name": name, "input": tool_input}
                blocks.append((block, pieces))
        if truncated:
            stop_reason = "max_tokens"
        else:
            stop_reason = reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn")
        return blocks, stop_reason, max(used, 1)

    def _stream(
        self,
        h: _Handler,
        plan: _Plan,
        message: dict[str, Any],
        blocks: list[tuple[dict[str, Any], list[str]]],
        stop_reason: str,
        output_tokens: int,
    ) -> None:
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("request-id", _new_id("req_"))
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return
        h.close_connection = True
        if self.ttft_ms and not _client_stays(h.connection, self.ttft_ms / 1000.0):
            with self._lock:
                self._count(message["model"], disconnects=1)
            return  # the client went away during the prefill (a stop): nothing is sent
        self._begin(plan)  # the prefill is done: what this request wrote is readable now

        def send(event: str, data: dict[str, Any]) -> None:
            h.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            h.wfile.flush()

        start_usage = dict(message["usage"], output_tokens=1)
        spent = 0
        t0 = time.monotonic()
        try:
            send("message_start", {"type": "message_start", "message": dict(message, usage=start_usage)})
            for index, (block, pieces) in enumerate(blocks):
                shell: dict[str, Any]
                if block["type"] == "text":
                    shell = {"type": "text", "text": ""}
                else:
                    shell = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                send("content_block_start", {"type": "content_block_start", "index": index, "content_block": shell})
                if index == 0:
                    send("ping", {"type": "ping"})
                for piece in pieces:
                    if block["type"] == "text":
                        delta = {"type": "text_delta", "text": piece}
                    else:
                        delta = {"type": "input_json_delta", "partial_json": piece}
                    if self.token_ms:
                        spent += self._tokens(piece)
                        wait = t0 + spent * self.token_ms / 1000.0 - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                    send("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                send("content_block_stop", {"type": "content_block_stop", "index": index})
            send(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                },
            )
            send("message_stop", {"type": "message_stop"})
        except OSError:  # the client went away
            with self._lock:
                self._count(message["model"], disconnects=1)


def _client_stays(conn: socket.socket, seconds: float) -> bool:
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


def _word_chunks(text: str, words: int = 3) -> list[str]:
    """Text in chunks of a few words (whitespace kept, so the chunks join back exactly)."""
    if not text:
        return []
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i : i + words]) for i in range(0, len(tokens), words)]
