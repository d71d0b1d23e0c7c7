"""A local imitation of the Anthropic Messages API, for tests and benchmarks.

Point the real SDK at it (``anthropic.Anthropic(base_url=server.url)`` or
``ANTHROPIC_BASE_URL=http://127.0.0.1:8765``) and it answers ``POST /v1/messages`` with the
real shapes: a whole Message, or server-sent events in the real order (``message_start``,
per block ``content_block_start`` / ``content_block_delta`` / ``content_block_stop``, a
``ping`` after the first block start, ``message_delta``, ``message_stop``).

Its point is the prompt cache, reproduced with the semantics that make laneflow's warm gate
matter: a cache entry is created when a request arrives, but it becomes readable only once
the response that wrote it has begun (when its ``message_start`` is sent, after the
``ttft_ms`` "prefill"). A request for the same prefix that arrives before that moment does
not read it: it writes it again and pays another cache write, as with the real API.

Approximations (documented, deterministic):

* Tokens of a text are ``ceil(len(text) / chars_per_token)``, counted per block: a tool
  definition is its canonical JSON, a text block its text, a ``tool_use`` its name plus the
  JSON of its input, a ``tool_result`` its content (text blocks' texts), anything else
  (images, documents...) its canonical JSON. The prompt is tools, then system, then the
  messages' content blocks, in order.
* Only explicit ``cache_control`` breakpoints are cache positions (the real API's automatic
  look-back over earlier block boundaries is not imitated). A request reads the longest
  readable, unexpired breakpoint prefix, and writes an entry at every breakpoint longer than
  what it read (billed once: ``cache_creation_input_tokens`` = the longest written prefix's
  tokens minus the read ones), so a shared prefix (tools + system) is cached on its own.
* Output tokens are counted the same way over the reply's text and tool-use inputs; a
  reply longer than ``max_tokens`` is cut there with ``stop_reason: "max_tokens"``.

Auth: the key comes in ``x-api-key`` or, as SDK 2.x sends ``api_key``, in
``Authorization: Bearer``; a missing key (or one not in ``api_keys``) is a 401.

Stdlib only. Loopback only (binds 127.0.0.1). Run it standalone with
``python -m laneflow_dev.imitation --port 8765 --ttft-ms 400 --token-ms 5``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import secrets
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["Reply", "Responder", "MessagesImitation", "default_responder", "DEFAULT_MIN_CACHEABLE", "main"]


HOST = "127.0.0.1"

MAX_BREAKPOINTS = 4


# Minimum cacheable prompt length (tokens of the prefix up to the breakpoint), per Anthropic's
# prompt-caching documentation. Matched by the longest prefix of the model id, so dated ids
# (claude-sonnet-4-5-20250929) work; "*" is the fallback.
DEFAULT_MIN_CACHEABLE: dict[str, int] = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-sonnet-4-5": 1024,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "*": 1024,
}


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



# --------------------------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One assistant turn the server will send."""

    text: str = ""
    tool_uses: list[dict] = field(default_factory=list)  # each {"name": str, "input": dict}
    stop_reason: str | None = None  # default: "tool_use" if tool_uses else "end_turn"



Responder = Callable[[dict], Reply]


_TOOL_DIRECTIVE = re.compile(r"^\[\[tool\s+([^\s\]]+)(?:\s+(.*?))?\s*\]\]$")

_REPLY_DIRECTIVE = re.compile(r"^\[\[reply(?:\s+(.*?))?\]\]$", re.S)



def _text_of(content: Any) -> str:
    """The text blocks of a message's content, joined by newlines."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
    return "\n".join(parts)



def _parse_script(text: str) -> tuple[list[dict], str | None, list[str]]:
    """(tool directives in order, the [[reply]] text or None, the other lines)."""
    tools: list[dict] = []
    reply: str | None = None
    rest: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        m = _TOOL_DIRECTIVE.match(line)
        if m:
            payload = (m.group(2) or "").strip()
            try:
                tool_input = json.loads(payload) if payload else {}
            except json.JSONDecodeError:
                tool_input = {"_unparsed": payload}
            if not isinstance(tool_input, dict):
                tool_input = {"value": tool_input}
            tools.append({"name": m.group(1), "input": tool_input})
            continue
        m = _REPLY_DIRECTIVE.match(line)
        if m:
            reply = (m.group(1) or "").replace("\\n", "\n")
            continue
        rest.append(raw)
    return tools, reply, rest



def default_responder(body: dict) -> Reply:
    """Scriptable without Python. In the FIRST user message, lines ``[[tool NAME {json}]]``
    script tool calls: on the k-th assistant turn (k = assistant messages already present)
    the k-th directive, if any, is answered with "Calling NAME." plus that tool_use.
    Otherwise the final text is ``Reply to: <first line of the first user message, without
    directives>`` and ``Turn <k+1>.``, or the text of a ``[[reply TEXT]]`` directive
    (``\\n`` escapes allowed)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    text = _text_of(first_user.get("content")) if first_user else ""
    tools, reply, rest = _parse_script(text)
    k = sum(1 for m in messages if m.get("role") == "assistant")
    if k < len(tools):
        call = tools[k]
        return Reply(text=f"Calling {call['name']}.", tool_uses=[call])
    if reply is not None:
        return Reply(text=reply)
    first_line = next((line.strip() for line in rest if line.strip()), "")
    return Reply(text=f"Reply to: {first_line}\nTurn {k + 1}.")



# --------------------------------------------------------------------------------------------
# Prompt accounting
# --------------------------------------------------------------------------------------------


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message



def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value



def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)



def _block_text(block: dict, *, is_tool: bool = False) -> str:
    """The text whose length stands for a block's tokens."""
    if is_tool:
        return _canonical(_strip_cache_control(block))
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        return str(block.get("name", "")) + _canonical(block.get("input", {}))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                b.get("text", "") if isinstance(b, dict) and b.get("type") == "text" else _canonical(_strip_cache_control(b))
                for b in content
            )
        return ""
    if kind == "thinking":
        return str(block.get("thinking", ""))
    return _canonical(_strip_cache_control(block))



@dataclass
class Breakpoint:
    key: str
    tokens: int  # prompt tokens up to and including the breakpoint's block
    ttl: str  # "5m" | "1h"



@dataclass
class Prompt:
    tokens: int
    breakpoints: list[Breakpoint]



def _cache_control_ttl(block: dict, where: str) -> str | None:
    cc = block.get("cache_control")
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise RequestError(400, f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise RequestError(400, f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    return ttl



def analyze_prompt(body: dict, chars_per_token: int) -> Prompt:
    """Count the prompt's tokens and find its cache breakpoints (validating them)."""
    model = body["model"]
    items: list[tuple[str, Any, dict, bool]] = []  # (where, position, block, is_tool)
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(400, "tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(400, f"tools.{i}: Input should be a valid dictionary")
        items.append((f"tools.{i}", ["tool"], tool, True))
    system = body.get("system")
    if isinstance(system, str):
        if system:
            items.append(("system", ["system"], {"type": "text", "text": system}, False))
    elif isinstance(system, list):
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise RequestError(400, f"system.{i}: Input should be a text block")
            items.append((f"system.{i}", ["system"], block, False))
    elif system is not None:
        raise RequestError(400, "system: Input should be a valid string or list of text blocks")
    for mi, message in enumerate(body["messages"]):
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for bi, block in enumerate(blocks):
            items.append((f"messages.{mi}.content.{bi}", ["message", mi, message["role"]], block, False))

    hasher = hashlib.sha256(model.encode("utf-8"))
    total = 0
    breakpoints: list[Breakpoint] = []
    saw_5m = False
    for where, position, block, is_tool in items:
        ttl = _cache_control_ttl(block, where)
        total += math.ceil(len(_block_text(block, is_tool=is_tool)) / chars_per_token)
        hasher.update(b"\x1e" + _canonical([position, _strip_cache_control(block)]).encode("utf-8"))
        if ttl is None:
            continue
        if ttl == "1h" and saw_5m:
            raise RequestError(
                400, "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
            )
        saw_5m = saw_5m or ttl == "5m"
        breakpoints.append(Breakpoint(key=hasher.copy().hexdigest(), tokens=total, ttl=ttl))
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise RequestError(
            400, f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(breakpoints)}."
        )
    return Prompt(tokens=total, breakpoints=breakpoints)



def validate_body(body: Any) -> None:
    """Validate the request body like the real API (a 400 naming the field)."""
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object")
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            raise RequestError(400, f"{name}: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise RequestError(400, "model: Input should be a valid string")
    mt = body["max_tokens"]
    if isinstance(mt, bool) or not isinstance(mt, int):
        raise RequestError(400, "max_tokens: Input should be a valid integer")
    if mt < 1:
        raise RequestError(400, "max_tokens: Input should be greater than or equal to 1")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise RequestError(400, "messages: Input should be a valid list")
    if not messages:
        raise RequestError(400, "messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(400, f"messages.{i}: Input should be a valid dictionary")
        if message.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise RequestError(400, f"messages.{i}.content: Field required")
        content = message["content"]
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise RequestError(400, f"messages.{i}.content.{j}: Input should be a content block with a type")
        elif not isinstance(content, str):
            raise RequestError(400, f"messages.{i}.content: Input should be a valid string or list")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError(400, "stream: Input should be a valid boolean")



# --------------------------------------------------------------------------------------------
# The cache and the stats
# --------------------------------------------------------------------------------------------


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
        "disconnects": 0,  # streams whose client closed the connection before the reply ended
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



# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True
    imitation: "MessagesImitation"



class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "laneflow-imitation"
    sys_version = ""
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    # -- plumbing -------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
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
        responder: Responder | None = None,
        api_keys: set[str] | None = None,
        ttl_s: float = 300.0,
        min_cacheable: dict[str, int] | None = None,
        chars_per_token: int = 4,
        ttl_1h_s: float = 3600.0,
    ):
        if chars_per_token < 1:
            raise ValueError("chars_per_token must be >= 1")
        self.port = port
        self.ttft_ms = ttft_ms
        self.token_ms = token_ms
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

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "MessagesImitation":
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

    def __enter__(self) -> "MessagesImitation":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- controls -------------------------------------------------------------------------

    def stats(self) -> dict:
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
        try:
            validate_body(body)
            prompt = analyze_prompt(body, self.chars_per_token)
        except RequestError as e:
            fail(e.status, e.message)
            return
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
        message = {
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
            if self.ttft_ms:
                time.sleep(self.ttft_ms / 1000.0)
            self._begin(plan)
            if self.token_ms:
                time.sleep(self.token_ms * output_tokens / 1000.0)
            message["content"] = [b for b, _ in blocks]
            message["stop_reason"] = stop_reason
            h._send_json(200, message)

    def _tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    def _render(self, reply: Reply, max_tokens: int) -> tuple[list[tuple[dict, list[str]]], str, int]:
        """The reply's content blocks, each with its delta pieces; its stop reason; its
        output tokens (cut at max_tokens)."""
        blocks: list[tuple[dict, list[str]]] = []
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
                cost = self._tokens(name + _canonical(tool_input))
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
        message: dict,
        blocks: list[tuple[dict, list[str]]],
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

        def send(event: str, data: dict) -> None:
            h.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode("utf-8"))
            h.wfile.flush()

        start_usage = dict(message["usage"], output_tokens=1)
        spent = 0
        t0 = time.monotonic()
        try:
            send("message_start", {"type": "message_start", "message": dict(message, usage=start_usage)})
            for index, (block, pieces) in enumerate(blocks):
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



# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m laneflow_dev.imitation",
        description="Serve a local imitation of the Anthropic Messages API (with prompt-cache semantics) on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free one); default 8765")
    parser.add_argument("--ttft-ms", type=int, default=0, help="time to first token (the prefill), ms")
    parser.add_argument("--token-ms", type=float, default=0.0, help="time per output token, ms")
    parser.add_argument("--ttl-s", type=float, default=300.0, help="TTL of 5m cache entries, s")
    parser.add_argument("--chars-per-token", type=int, default=4)
    parser.add_argument("--api-key", action="append", default=None, help="accepted x-api-key (repeatable); default any")
    args = parser.parse_args(argv)
    server = MessagesImitation(
        port=args.port,
        ttft_ms=args.ttft_ms,
        token_ms=args.token_ms,
        ttl_s=args.ttl_s,
        chars_per_token=args.chars_per_token,
        api_keys=set(args.api_key) if args.api_key else None,
    )
    try:
        server.start()
    except OSError as e:
        print(f"imitation: cannot listen on {HOST}:{args.port}: {e}", file=sys.stderr)
        return 1
    print(server.url, flush=True)
    print(f"# export ANTHROPIC_BASE_URL={server.url}  (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
