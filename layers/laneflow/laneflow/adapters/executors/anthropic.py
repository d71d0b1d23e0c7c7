"""The Claude executor: the Messages API through the anthropic SDK, streaming.

- The stable prompt layers are one cached system block (`cache_control` at its end); the
  dynamic layers follow it, uncached. Tools are sent in a stable order, so they are part of
  the cached prefix.
- The stream's first event opens the warm gate (`sink.first_event`); a stable prefix below
  the model's minimum cacheable length (the price catalog's) opens it before the first call
  (`sink.prefix_uncacheable`), since its siblings could read nothing.
- A tool-use loop over the step's tools (`StepTools`: the file tools, bash and the script
  tools its agent.md grants, the same registry the stub's `tool:` lines use), each call
  recorded as a tool event. Colleagues' messages and answers not yet given join the next
  turn as text blocks after the tool results (before the first turn: after the instruction;
  after a final reply, one more turn hears them).
- The agent's `effort` goes as `output_config={"effort": ...}` to a model whose catalog
  entry lists that level (with the beta header the catalog names, through the SDK's beta
  messages, where the model takes it only in beta); to any other model it is not sent, and
  the trace says so once.
- Every turn is a model-call span with usage (input, output, cache read and write), time to
  first token and cost from the price catalog; a turn is reported when it starts and
  updated when it ends (one span).
- Rate limits, 5xx and overloaded answers are retried with backoff; an authentication
  refusal is a clear step failure that says so; `max_turns` and `timeout` are honoured.
- A stop ends the HTTP request at once, at any point of it (before its response's headers
  too, while it waits for its first token): one watcher thread (the executor's) polls each
  call's `sink.stopped()` and shuts the socket its request went out on (`_CallWatch`), which
  the call learns through httpx's `trace` extension (`_CallSockets`).
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic

from laneflow.adapters.executors.isolation import Isolation
from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.errors import AttemptEnded, StepFailed, StepStopped
from laneflow.domain.gate import prefix_tokens
from laneflow.domain.pricing import PriceCatalog, catalog
from laneflow.domain.records import EventType, ModelCall, Tokens, utcnow
from laneflow.ports import ExecutionSink, StepJob, StepOutcome

try:  # the transport the SDK streams over (httpx2 from anthropic 2.x, httpx before)
    import httpx2 as _http
except ImportError:  # pragma: no cover
    import httpx as _http  # type: ignore[no-redef]


DEFAULT_MAX_TURNS = 16

DEFAULT_MAX_TOKENS = 4096

# A read or connection error mid-stream surfaces as the transport's own exception.
RETRYABLE = (anthropic.RateLimitError, anthropic.InternalServerError, anthropic.APIConnectionError, _http.TransportError)

TIMEOUTS = (anthropic.APITimeoutError, _http.TimeoutException)

UNREADABLE_INPUT = "unreadable_input"  # the key a tool_use input that was not a JSON object is kept under

STOPPED_BEFORE_REPLY = "stopped by a person (its model call was ended before the reply began)"


class _Watcher:
    """One thread that watches every model call of an executor while it is in flight.

    A thread a call cost a thread's creation on each call's critical path (about 0.3 ms of
    CPU, with a hundred siblings starting at once) and a hundred threads waking ten times a
    second to ask the same question. The thread starts with the first call and ends once
    no call is left. It asks the calls one after another: a sink reads the store at most
    every 0.5 s, so a sweep over N calls whose store answers in L costs about N x L / 5 (50
    calls on a DynamoDB table 50 ms away: 0.5 s), and a stop reaches the last call that
    much later; in the cloud a step's process has one call."""

    def __init__(self, poll_s: float = 0.1):
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._calls: set[_CallWatch] = set()
        self._thread: threading.Thread | None = None

    def add(self, call: _CallWatch) -> None:
        with self._lock:
            self._calls.add(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="laneflow-call-watch", daemon=True)
                self._thread.start()

    def remove(self, call: _CallWatch) -> None:
        with self._lock:
            self._calls.discard(call)

    def _watch(self) -> None:
        try:
            while True:
                time.sleep(self.poll_s)
                with self._lock:
                    calls = list(self._calls)
                    if not calls:
                        self._thread = None
                        return
                for call in calls:
                    call.check()
        except BaseException:
            # Whatever ended it, the next call in flight starts another: the calls are never
            # left without a watcher.
            with self._lock:
                self._thread = None
            raise


class _CallWatch:
    """Ends one model call's HTTP request as soon as the run's stop is requested.

    The stream's reader blocks in a socket read while the model thinks (20 s to a first
    token is not rare), and before that while the API (or a proxy) holds the response's
    headers, so checking `sink.stopped()` between events would see a stop only when the next
    event comes. The executor's watcher thread asks it instead, every `poll_s`, and on a stop
    shuts down the socket the call's request went out on, which wakes that read at once
    (closing the response, or the connection, alone waits for the next byte). The socket is
    the call's from the moment its request is written on it (`using`, told by
    `_CallSockets`) until its response is closed; a stop that comes before (while the
    connection is being opened) shuts it the moment the request is written."""

    def __init__(self, sink: ExecutionSink, watcher: _Watcher):
        self.sink, self.watcher = sink, watcher
        self.fired = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self._stream: Any = None  # the network stream the request went out on, while it is this call's

    def start(self) -> _CallWatch:
        self.watcher.add(self)
        return self

    def close(self) -> None:
        """The call is over: it is watched no more."""
        self.watcher.remove(self)

    def attach(self, response: Any) -> None:
        with self._lock:
            self._response = response
        if self.fired.is_set():
            self._abort()

    def using(self, stream: Any) -> None:
        """The call's request is being written on `stream` (a connection of the client's
        pool, new or reused); None once its response is closed and the connection may serve
        another call."""
        with self._lock:
            if stream is self._stream:
                return
            self._stream = stream
        if stream is not None and self.fired.is_set():
            self._abort()

    def check(self) -> None:
        """One look at the sink (on the watcher's thread): a stop ends the call."""
        if self.fired.is_set():
            return
        try:
            stop = self.sink.stopped()
        except AttemptEnded:
            stop = True  # someone ended the attempt (a stop, an interruption): the call is over too
        except Exception:  # a store hiccup: look again at the next poll
            return
        if stop:
            self.fired.set()
            self.close()
            self._abort()

    def _abort(self) -> None:
        with self._lock:
            response, self._response = self._response, None
            network = self._stream
        if network is None and response is not None:
            network = response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
        if response is None:
            return
        try:
            response.close()
        except Exception:  # the reader sees the shut socket either way
            pass


class _CallSockets:
    """Tells each model call which connection its request goes out on, so a stop can shut
    that socket before the response's headers have come (an overloaded API, a proxy holding
    the response), when the response, the only place the SDK shows a connection, does not
    exist yet.

    Only public hooks: the anthropic SDK takes its HTTP client (`http_client=`, the SDK's own
    `DefaultHttpxClient`, so its timeouts, connection limits, keep-alive options and proxies
    from the environment stay as they are); httpx runs the client's `request` event hooks on
    the calling thread before it sends; a request's `trace` extension (httpx and httpcore's
    documented one) tells each connection it opens, with its network stream
    (`connection.connect_tcp.complete`, `connection.start_tls.complete`), and when its
    response is closed (`http11.response_closed.started`, before the connection goes back
    to the pool). A connection the pool reuses for a later call opens nothing, so each stream
    the client opens has its `write` (the network stream interface's method httpcore sends
    a request with) tell the call of the thread writing on it. HTTP/1.1 only (the SDK's
    default): a connection carries one request at a time, so its socket is that call's alone.
    Cost: a thread-local read per write on a stream, and nothing per event read."""

    OPENED = (
        "connection.connect_tcp.complete",
        "connection.connect_unix_socket.complete",
        "connection.start_tls.complete",
        "http_proxy.start_tls.complete",  # TLS inside a proxy's tunnel
    )

    def __init__(self) -> None:
        self._calls = threading.local()  # the call this thread is making: its `_CallWatch`

    @contextmanager
    def calling(self, watch: _CallWatch) -> Iterator[None]:
        """The calls made on this thread meanwhile are `watch`'s."""
        self._calls.watch = watch
        try:
            yield
        finally:
            self._calls.watch = None

    def client(self) -> Any:
        """An HTTP client for the SDK, with the SDK's defaults, whose requests say their
        connections."""
        return anthropic.DefaultHttpxClient(event_hooks={"request": [self._on_request]})

    def _current(self) -> _CallWatch | None:
        return getattr(self._calls, "watch", None)

    def _on_request(self, request: Any) -> None:
        watch = self._current()
        if watch is not None:  # the request's events are its call's, whichever thread closes its response
            request.extensions["trace"] = functools.partial(self._trace, watch)

    def _trace(self, watch: _CallWatch, event: str, info: dict[str, Any]) -> None:
        if event in self.OPENED:
            stream = info.get("return_value")
            if stream is not None:
                self._tell_writers(stream)
                watch.using(stream)
        elif event == "http11.response_closed.started":
            watch.using(None)

    def _tell_writers(self, stream: Any) -> None:
        """From now on, a request written on `stream` makes it its call's (for a connection
        reused by later calls, which open nothing)."""
        write = stream.write
        if getattr(write, "tells_its_call", False):
            return

        def tell_and_write(buffer: bytes, timeout: float | None = None) -> None:
            watch = self._current()
            if watch is not None:
                watch.using(stream)
            write(buffer, timeout)

        tell_and_write.tells_its_call = True  # type: ignore[attr-defined]
        stream.write = tell_and_write


@dataclass
class Turn:
    id: str = ""
    text: list[str] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop: str | None = None
    tokens: Tokens = field(default_factory=Tokens)
    ttft_ms: int | None = None

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b["type"] == "tool_use"]


class AnthropicExecutor:
    name = "anthropic"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        prices: PriceCatalog | None = None,
        api_retries: int = 4,
        backoff_s: float = 0.5,
        client_factory: Callable[[], anthropic.Anthropic] | None = None,
        isolation: Isolation | None = None,
    ):
        self.isolation = isolation  # where the step's programs run (None: the strongest here)
        self._api_key, self._base_url = api_key, base_url
        self.prices = prices or catalog()
        self.api_retries, self.backoff_s = api_retries, backoff_s
        self._factory = client_factory
        self._client: anthropic.Anthropic | None = None
        self._lock = threading.Lock()
        self._watcher = _Watcher()  # every call in flight is watched for a stop by one thread
        self._sockets = _CallSockets()  # which connection each call's request went out on

    @property
    def client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._client is None:
                if self._factory:
                    self._client = self._factory()
                else:
                    self._client = anthropic.Anthropic(
                        api_key=self._api_key, base_url=self._base_url, max_retries=0, http_client=self._sockets.client()
                    )
            return self._client

    # -- one attempt ---------------------------------------------------------------------

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        tools = StepTools(job, sink, isolation=self.isolation)
        tools.prepare()  # before any model call: the isolation named, network_enforce honoured
        tool_defs = tools.definitions()
        system: list[dict[str, Any]] = [{"type": "text", "text": job.system_stable, "cache_control": {"type": "ephemeral"}}]
        if job.system_dynamic:
            system.append({"type": "text", "text": job.system_dynamic})
        messages: list[dict[str, Any]] = [{"role": "user", "content": _with_notes(job.user, tools.colleagues.pending())}]
        self._check_cacheable(job, tool_defs, sink)
        deadline = time.monotonic() + job.timeout if job.timeout else None
        max_turns = job.max_turns or DEFAULT_MAX_TURNS
        price = self.prices.price(job.model)
        if price is None:
            sink.event(EventType.warning, f"no price for model {job.model} in the catalog: its spend is counted as 0")
        effort = _effort_params(job, price, sink)
        texts: list[str] = []
        cost = 0.0
        for number in range(1, max_turns + 1):
            params: dict[str, Any] = {
                "model": job.model,
                "max_tokens": DEFAULT_MAX_TOKENS,
                "system": system,
                "messages": messages,
                **effort,
            }
            if tool_defs:
                params["tools"] = tool_defs
            if job.budget is not None and cost >= job.budget:
                raise StepFailed(_over_budget(cost, job.budget), retryable=False)
            left = job.budget - cost if job.budget is not None else None
            sink.begin_turn()  # the run's budget: no turn begins once it is spent
            turn = self._turn_with_retries(params, sink, job, deadline, price, left)
            cost += price.cost(turn.tokens) if price else 0.0
            if turn.text:
                texts.append("".join(turn.text).strip())
            messages.append({"role": "assistant", "content": turn.blocks})
            if turn.stop != "tool_use" or not turn.tool_uses:
                late = _late_notes(tools, may_go_on=number < max_turns and turn.stop == "end_turn")
                if late:  # a colleague's message came while it finished: it hears it before it ends
                    messages.append({"role": "user", "content": late})
                    continue
                return StepOutcome(
                    result="\n\n".join(t for t in texts if t), conclusion="".join(turn.text).strip(), cost_usd=cost, turns=number
                )
            results: list[dict[str, Any]] = [self._tool_result(use, tools, bool(tool_defs), sink) for use in turn.tool_uses]
            # Colleagues' messages (and answers) that came meanwhile join the next turn.
            messages.append({"role": "user", "content": results + _text_blocks(tools.colleagues.pending())})
        raise StepFailed(f"reached max_turns ({max_turns}) before a final reply", retryable=False)

    @staticmethod
    def _tool_result(use: dict[str, Any], tools: StepTools, has_tools: bool, sink: ExecutionSink) -> dict[str, Any]:
        """Run one tool_use and record it; its own failure is the model's to hear, never a crashed step."""
        started = time.monotonic()
        try:
            if not has_tools:
                raise ToolError("this step has no tools")
            if UNREADABLE_INPUT in use["input"]:
                raise ToolError(f"the input of this {use['name']} call is not a JSON object; call it again with one")
            output, is_error = tools.run(use["name"], use["input"]), False
        except ToolError as exc:
            output, is_error = str(exc), True
        sink.tool_call(
            use["name"],
            json.dumps(use["input"], ensure_ascii=False),
            output,
            ms=int((time.monotonic() - started) * 1000),
            is_error=is_error,
        )
        return {"type": "tool_result", "tool_use_id": use["id"], "content": output, "is_error": is_error}

    def _check_cacheable(self, job: StepJob, tool_defs: list[dict[str, Any]], sink: ExecutionSink) -> None:
        """Before the first model call: a prefix (the stable layers and the tools) below the
        model's minimum cacheable length is never cached, so a lead need not hold its siblings."""
        minimum = self.prices.min_cacheable(job.model)
        if minimum is None:
            return
        tools = len(json.dumps(tool_defs, separators=(",", ":"), ensure_ascii=False)) if tool_defs else 0
        tokens = prefix_tokens(len(job.system_stable), tools)
        if tokens < minimum:
            sink.prefix_uncacheable(tokens, minimum)

    # -- one turn, with retries of what is not the step's fault ---------------------------

    def _turn_with_retries(
        self, params: dict[str, Any], sink: ExecutionSink, job: StepJob, deadline: float | None, price: Any, left: float | None
    ) -> Turn:
        for tried in range(self.api_retries + 1):
            try:
                return self._turn(params, sink, job, deadline, price, left)
            except anthropic.AuthenticationError:
                raise StepFailed(
                    "the model API refused the credentials (authentication failed): check ANTHROPIC_API_KEY", retryable=False
                ) from None
            except anthropic.PermissionDeniedError:
                raise StepFailed("the model API refused this request (permission denied)", retryable=False) from None
            except anthropic.NotFoundError:
                raise StepFailed(f"the model API does not know model {job.model!r}", retryable=False) from None
            except anthropic.BadRequestError as exc:
                raise StepFailed(f"the model API rejected the request: {_message(exc)}", retryable=False) from None
            except RETRYABLE as exc:
                what = _describe(exc)
                if tried == self.api_retries:
                    raise StepFailed(f"the model API failed {tried + 1} times: {what}", retryable=True) from None
                wait = _retry_after(exc) or self.backoff_s * (2**tried)
                if deadline and time.monotonic() + wait > deadline:
                    raise StepFailed(
                        f"timed out after {job.timeout:g} s (the model API was busy: {what})", retryable=False
                    ) from None
                sink.event(EventType.warning, f"model API busy ({what}); retrying in {wait:.1f} s")
                self._sleep(wait, sink)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _sleep(seconds: float, sink: ExecutionSink) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if sink.stopped():
                raise StepStopped()
            time.sleep(min(0.1, left))

    def _create(self, params: dict[str, Any], timeout: float | None) -> Any:
        """Start one turn's stream: through the beta messages where the request names betas
        (a model that takes a parameter only in beta, such as effort on Opus 4.5)."""
        if "betas" in params:
            return self.client.beta.messages.create(**params, stream=True, timeout=timeout)
        return self.client.messages.create(**params, stream=True, timeout=timeout)

    def _turn(
        self, params: dict[str, Any], sink: ExecutionSink, job: StepJob, deadline: float | None, price: Any, left: float | None
    ) -> Turn:
        timeout = _time_left(deadline, job)
        reader = _TurnReader(model=params["model"], price=price, left=left)
        turn = reader.turn
        watch = _CallWatch(sink, self._watcher).start()
        try:
            with self._sockets.calling(watch):
                stream = self._create(params, timeout)
            watch.attach(stream.response)
            with stream:
                for event in stream:
                    reader.read(event, sink)
                    if sink.stopped():
                        raise StepStopped()
            if watch.fired.is_set():  # the stop shut the stream: it ended early, not complete
                raise StepStopped(_stopped_reason(turn))
        except StepFailed:
            if turn.id:
                sink.call(reader.span())  # what the turn spent until it was stopped
            raise
        except TIMEOUTS:
            if deadline and time.monotonic() >= deadline - 0.05:
                raise StepFailed(f"timed out after {job.timeout:g} s", retryable=False) from None
            raise
        except Exception:
            if not watch.fired.is_set():
                raise
            # The stop shut the request down; whatever the transport made of that, it is a stop.
            if turn.id:
                sink.call(reader.span())
            raise StepStopped(_stopped_reason(turn)) from None
        finally:
            watch.close()
        # Text blocks that stayed empty are not sent back.
        turn.blocks = [b for b in turn.blocks if b["type"] != "text" or b["text"]]
        if turn.id:
            sink.call(reader.span())
        return turn


class _TurnReader:
    """What one turn's stream has said so far: its events read one at a time into a `Turn`
    (text, tool_use blocks, usage, stop reason, time to first token), its span, and the
    agent's budget checked as it goes (mid-turn, the output estimated at 4 characters a
    token)."""

    def __init__(self, *, model: str, price: Any, left: float | None):
        self.model, self.price, self.left = model, price, left
        self.turn = Turn()
        self.started, self.at = time.monotonic(), utcnow()
        self.json_parts: dict[int, list[str]] = {}
        self.out_chars = 0

    def span(self) -> ModelCall:
        turn = self.turn
        return ModelCall(
            id=turn.id or f"turn-{self.at}",
            at=self.at,
            ms=int((time.monotonic() - self.started) * 1000),
            ttft_ms=turn.ttft_ms,
            model=self.model,
            tokens=turn.tokens,
            tools=len(turn.tool_uses),
            stop=turn.stop,
            cost_usd=round(self.price.cost(turn.tokens), 8) if self.price else 0.0,
        )

    def read(self, event: Any, sink: ExecutionSink) -> None:
        handler = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
        }.get(event.type)
        if handler is not None:
            handler(event, sink)

    def _check_budget(self, tokens: Tokens) -> None:
        if self.left is not None and self.price and self.price.cost(tokens) >= self.left:
            self.turn.tokens = tokens
            raise StepFailed(_over_budget(self.price.cost(tokens), self.left), retryable=False)

    def _message_start(self, event: Any, sink: ExecutionSink) -> None:
        sink.first_event()
        usage = event.message.usage
        self.turn.id = event.message.id
        self.turn.tokens = Tokens(
            input=usage.input_tokens or 0,
            output=usage.output_tokens or 0,
            cache_read=getattr(usage, "cache_read_input_tokens", 0) or 0,
            cache_write=getattr(usage, "cache_creation_input_tokens", 0) or 0,
        )
        sink.call(self.span())
        self._check_budget(self.turn.tokens)

    def _block_start(self, event: Any, sink: ExecutionSink) -> None:
        block = event.content_block
        if block.type == "tool_use":
            self.turn.blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": {}})
            self.json_parts[event.index] = []
        else:
            self.turn.blocks.append({"type": "text", "text": ""})

    def _block_delta(self, event: Any, sink: ExecutionSink) -> None:
        turn = self.turn
        if turn.ttft_ms is None:
            turn.ttft_ms = int((time.monotonic() - self.started) * 1000)
        delta = event.delta
        if delta.type == "text_delta":
            turn.text.append(delta.text)
            turn.blocks[-1]["text"] += delta.text
            self.out_chars += len(delta.text)
        elif delta.type == "input_json_delta":
            self.json_parts.setdefault(event.index, []).append(delta.partial_json)
            self.out_chars += len(delta.partial_json)
        if self.left is not None and self.price:
            self._check_budget(turn.tokens.model_copy(update={"output": max(turn.tokens.output, self.out_chars // 4)}))

    def _block_stop(self, event: Any, sink: ExecutionSink) -> None:
        turn = self.turn
        if event.index in self.json_parts and turn.blocks and turn.blocks[-1]["type"] == "tool_use":
            turn.blocks[-1]["input"] = _tool_input("".join(self.json_parts.pop(event.index)))

    def _message_delta(self, event: Any, sink: ExecutionSink) -> None:
        self.turn.stop = event.delta.stop_reason
        if event.usage and event.usage.output_tokens is not None:
            self.turn.tokens = self.turn.tokens.model_copy(update={"output": event.usage.output_tokens})


def _text_blocks(texts: list[str]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text} for text in texts]


def _late_notes(tools: StepTools, *, may_go_on: bool) -> list[dict[str, Any]]:
    """After a final reply: what colleagues sent meanwhile, as one more turn's content (none
    when no turn is left)."""
    return _text_blocks(tools.colleagues.pending()) if may_go_on else []


def _with_notes(user: str, notes: list[str]) -> str | list[dict[str, Any]]:
    """The first user message, with what colleagues and people sent before it began."""
    if not notes:
        return user
    return [{"type": "text", "text": user}, *_text_blocks(notes)]


def _effort_params(job: StepJob, price: Any, sink: ExecutionSink) -> dict[str, Any]:
    """What a request carries for the agent's `effort`: `output_config` (and `betas` where
    the model takes it in beta) when the catalog says the model takes that level; else
    nothing, and the trace says so once."""
    if not job.effort:
        return {}
    levels = price.efforts if price else ()
    if job.effort not in levels:
        if levels:
            why = f"model {job.model} takes effort {', '.join(levels)}, not {job.effort!r}"
        else:
            why = f"model {job.model} does not take an effort setting"
        sink.event(EventType.warning, f"effort {job.effort!r} is not sent: {why}")
        return {}
    params: dict[str, Any] = {"output_config": {"effort": job.effort}}
    if price.effort_beta:
        params["betas"] = [price.effort_beta]
    return params


def _time_left(deadline: float | None, job: StepJob) -> float | None:
    """Seconds a turn may still take before the step's `timeout:` (None: no timeout)."""
    if not deadline:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise StepFailed(f"timed out after {job.timeout:g} s", retryable=False)
    return left


def _tool_input(raw: str) -> dict[str, Any]:
    """A tool_use block's input from its streamed JSON. What is not a JSON object (a list,
    a stream cut short) is kept under UNREADABLE_INPUT: the block can still be sent back as
    the object the API requires, and the tool loop answers the call with an error."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {UNREADABLE_INPUT: raw[:2000]}


def _stopped_reason(turn: Turn) -> str:
    return "stopped by a person" if turn.id else STOPPED_BEFORE_REPLY


def _over_budget(spent: float, left: float) -> str:
    return f"stopped at its budget: ${left:.4f} was left for this step and the model had spent ${spent:.4f}"


def _message(exc: anthropic.APIStatusError) -> str:
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
    return str(error.get("message") or exc.message)[:300]


def _describe(exc: Exception) -> str:
    if isinstance(exc, anthropic.APIStatusError):
        return f"{exc.status_code} {_message(exc)}"
    return type(exc).__name__


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
