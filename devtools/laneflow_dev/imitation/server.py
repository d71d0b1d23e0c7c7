"""The imitation itself: a Messages API on loopback (its HTTP side: handler.py) that answers
``POST /v1/messages`` with a whole Message or its server-sent events (rendering.py), keeping
the prompt cache (cache.py) and the stats, with the controls tests use: `fail_next`, `reset`,
a responder, a time to first token and a pace of output, headers held back, a fast cache
clock (`clock_rate`, `clock_epoch`; read with `now()`). The server tools a request carries
it runs itself (web.py)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from laneflow_dev.imitation.cache import CacheClock, Plan, PromptCache
from laneflow_dev.imitation.handler import Handler, Server, api_key_of, client_stays, new_id
from laneflow_dev.imitation.prompt import (
    DEFAULT_MIN_CACHEABLE,
    RequestError,
    analyze_prompt,
    validate_body,
    validate_output_config,
)
from laneflow_dev.imitation.rendering import Blocks, count_tokens, new_message, render, stream_events
from laneflow_dev.imitation.replies import Responder, default_responder
from laneflow_dev.imitation.web import serve, validate_tools

HOST = "127.0.0.1"

MAX_KEPT = 1_000  # requests kept in `received`


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
        # Writes by TTL: the tokens written to 5-minute and to 1-hour entries, and the requests
        # that wrote each (one request can write both, at two breakpoints).
        "cache_write_5m_tokens": 0,
        "cache_write_1h_tokens": 0,
        "cache_writes_5m": 0,
        "cache_writes_1h": 0,
        "cold_prefixes": 0,  # requests that wrote the cache and read none of it: each paid a cold prefix
        "disconnects": 0,  # responses whose client closed the connection before the reply ended
        "held": 0,  # requests whose response headers were held (`hold_headers_ms`)
        "web_search_requests": 0,  # the server tools' uses made (usage.server_tool_use)
        "web_fetch_requests": 0,
    }


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
        clock_rate: float | None = None,
        clock_epoch: float | None = None,
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
        # The cache's clock (TTLs and entry times; both TTLs are in its seconds): the wall
        # clock, or `clock_rate` times as fast from `clock_epoch`; neither given, the one
        # LANEFLOW_CACHE_CLOCK names, as laneflow reads it.
        self.clock = CacheClock.of(clock_rate, clock_epoch)
        # The given minimums are merged over the documented defaults ("*" sets the fallback).
        self.min_cacheable = {**DEFAULT_MIN_CACHEABLE, **(min_cacheable or {})}
        self.chars_per_token = chars_per_token
        self.url = ""
        self._lock = threading.Lock()
        self._cache = PromptCache()
        self._fail: list[int] = []
        self._totals = _new_counts()
        self._by_model: dict[str, dict[str, int]] = {}
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        # The requests to /v1/messages as they arrived (the last MAX_KEPT): body and headers.
        self.received: list[dict[str, Any]] = []
        # When (epoch seconds) each request to /v1/messages arrived whole, and each streamed
        # response's first event went out (the last MAX_KEPT): what a benchmark times a
        # released fan-out by, apart from what the client recorded.
        self._arrivals: list[float] = []
        self._first_events: list[float] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> MessagesImitation:
        if self._server is not None:
            return self
        server = Server((HOST, self.port), Handler)
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
            out["arrivals"], out["first_events"] = list(self._arrivals), list(self._first_events)
            return out

    def reset(self) -> None:
        with self._lock:
            self._cache.clear()
            self._totals = _new_counts()
            self._by_model = {}
            self._arrivals, self._first_events = [], []

    def now(self) -> float:
        """Now on the cache's clock, in epoch seconds."""
        return self.clock.now()

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

    def _begin(self, plan: Plan) -> None:
        """The response begins: what it wrote becomes readable."""
        if not plan.written:
            return
        with self._lock:
            plan.begin(self.now())

    # -- the endpoint ---------------------------------------------------------------------

    def handle_messages(self, h: Handler, raw: bytes) -> None:
        with self._lock:
            self._arrivals.append(time.time())
            del self._arrivals[:-MAX_KEPT]
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
        key = api_key_of(h.headers)
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
            validate_tools(body, betas)
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

        served = serve(reply.server_uses, body, self.chars_per_token)
        blocks, stop_reason, output_tokens = render(reply, body["max_tokens"], self.chars_per_token, served)
        with self._lock:
            plan = self._cache.plan(prompt, self.min_cacheable_for(model), self._entry_ttl, self.now())
            input_tokens = prompt.tokens - plan.read_tokens - plan.write_tokens + served.input_tokens
            self._count(
                model,
                requests=1,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cache_write_tokens=plan.write_tokens,
                cache_read_tokens=plan.read_tokens,
                cache_writes=1 if plan.write_tokens else 0,
                cache_reads=1 if plan.read_tokens else 0,
                cache_write_5m_tokens=plan.write_5m,
                cache_write_1h_tokens=plan.write_1h,
                cache_writes_5m=1 if plan.write_5m else 0,
                cache_writes_1h=1 if plan.write_1h else 0,
                cold_prefixes=1 if plan.write_tokens and not plan.read_tokens else 0,
                web_search_requests=served.searches,
                web_fetch_requests=served.fetches,
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
        if reply.server_uses:
            usage["server_tool_use"] = served.usage()
        message = new_message(model, usage)
        if body.get("stream"):
            self._stream(h, plan, message, blocks, stop_reason, output_tokens)
        else:
            self._whole(h, plan, message, blocks, stop_reason, output_tokens)

    def _whole(
        self,
        h: Handler,
        plan: Plan,
        message: dict[str, Any],
        blocks: Blocks,
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

    def _hold_headers(self, h: Handler, model: str | None) -> bool:
        """Hold the response's headers `hold_headers_ms` (if set), watching the connection:
        False (counted as a disconnect) as soon as the caller closes it."""
        if not self.hold_headers_ms:
            return True
        with self._lock:
            self._count(model, held=1)
        if client_stays(h.connection, self.hold_headers_ms / 1000.0):
            return True
        with self._lock:
            self._count(model, disconnects=1)
        h.close_connection = True
        return False

    def _stream(
        self,
        h: Handler,
        plan: Plan,
        message: dict[str, Any],
        blocks: Blocks,
        stop_reason: str,
        output_tokens: int,
    ) -> None:
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("request-id", new_id("req_"))
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return
        h.close_connection = True
        if self.ttft_ms and not client_stays(h.connection, self.ttft_ms / 1000.0):
            with self._lock:
                self._count(message["model"], disconnects=1)
            return  # the client went away during the prefill (a stop): nothing is sent
        self._begin(plan)  # the prefill is done: what this request wrote is readable now
        with self._lock:
            self._first_events.append(time.time())
            del self._first_events[:-MAX_KEPT]

        spent = 0
        t0 = time.monotonic()

        def pace(piece: str) -> None:  # each delta goes out when its tokens would have been made
            nonlocal spent
            if self.token_ms:
                spent += count_tokens(piece, self.chars_per_token)
                wait = t0 + spent * self.token_ms / 1000.0 - time.monotonic()
                if wait > 0:
                    time.sleep(wait)

        try:
            for event, data in stream_events(message, blocks, stop_reason, output_tokens, pace):
                h.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                h.wfile.flush()
        except OSError:  # the client went away
            with self._lock:
                self._count(message["model"], disconnects=1)
