"""The Claude executor: the Messages API through the anthropic SDK, streaming.

- The stable prompt layers are one cached system block (`cache_control` at its end, with
  `ttl: "1h"` when the job's `cache_ttl` is "1h"); the dynamic layers follow it, uncached.
  Tools are sent in a stable order, so they are part of the cached prefix.
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
- The server tools an agent.md grants (`web_search`, `web_fetch`: web.py) go as definitions
  among the tools; the API runs them. Their blocks stay in the assistant message as they
  came, each use is recorded as a tool call, their requests priced with the turn; a turn
  the API paused (`pause_turn`) is sent back as it is, to go on.
- Every turn is a model-call span with usage (input, output, cache read and write, the
  write's 1-hour part apart), time to first token and cost from the price catalog; a turn
  is reported when it starts and updated when it ends (one span).
- Rate limits, 5xx and overloaded answers are retried with backoff; an authentication
  refusal is a clear step failure that says so; `max_turns` and `timeout` are honoured.
- A stop ends the HTTP request at once, at any point of it (before its response's headers
  too, while it waits for its first token): one watcher thread (the executor's) polls each
  call's `sink.stopped()` and shuts the socket its request went out on (`CallWatch`), which
  the call learns through httpx's `trace` extension (`CallSockets`).

Here: the executor, its tool-use loop and its turns with their retries. The stop watch:
claude_watch.py; reading a turn's stream: claude_stream.py; what a request carries (the
cached system block, the effort, the colleagues' notes): claude_request.py; what the API's
errors mean for the step: claude_errors.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic

from laneflow.adapters.executors.claude_errors import REFUSALS, RETRYABLE, TIMEOUTS, describe, refusal, retry_after
from laneflow.adapters.executors.claude_ready import ReadyRequest, wait_at_gate
from laneflow.adapters.executors.claude_request import (
    DEFAULT_MAX_TOKENS,
    check_cacheable,
    effort_params,
    late_notes,
    system_blocks,
    text_blocks,
    with_betas,
    with_notes,
)
from laneflow.adapters.executors.claude_stream import UNREADABLE_INPUT, Turn, TurnReader, over_budget
from laneflow.adapters.executors.claude_watch import CallSockets, CallWatch, Watcher
from laneflow.adapters.executors.isolation import Isolation
from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.adapters.executors.web import record_server_uses
from laneflow.domain.errors import StepFailed, StepStopped
from laneflow.domain.estimate import DEFAULT_MAX_TURNS
from laneflow.domain.pricing import PriceCatalog, catalog
from laneflow.domain.records import EventType
from laneflow.ports import ExecutionSink, StepJob, StepOutcome

STOPPED_BEFORE_REPLY = "stopped by a person (its model call was ended before the reply began)"


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
        self._http: Any = None  # the client's HTTP client, when it is this executor's own (claude_ready)
        self._lock = threading.Lock()
        self._watcher = Watcher()  # every call in flight is watched for a stop by one thread
        self._sockets = CallSockets()  # which connection each call's request went out on

    @property
    def client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._client is None:
                if self._factory:
                    self._client = self._factory()
                else:
                    self._http = self._sockets.client()
                    self._client = anthropic.Anthropic(
                        api_key=self._api_key, base_url=self._base_url, max_retries=0, http_client=self._http
                    )
            return self._client

    # -- one attempt ---------------------------------------------------------------------

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        tools = StepTools(job, sink, isolation=self.isolation)
        try:
            return self._attempt(job, sink, tools)
        finally:
            tools.close()  # its MCP servers end with the attempt

    def _attempt(self, job: StepJob, sink: ExecutionSink, tools: StepTools) -> StepOutcome:
        tools.prepare()  # before any model call: the isolation named, network_enforce honoured
        tool_defs = tools.definitions()
        system = system_blocks(job)
        messages: list[dict[str, Any]] = [{"role": "user", "content": with_notes(job.user, tools.colleagues.pending())}]
        check_cacheable(self.prices, job, tool_defs, sink)
        deadline = time.monotonic() + job.timeout if job.timeout else None
        max_turns = job.max_turns or DEFAULT_MAX_TURNS
        price = self.prices.price(job.model)
        if price is None:
            sink.event(EventType.warning, f"no price for model {job.model} in the catalog: its spend is counted as 0")
        effort = with_betas(effort_params(job, price, sink), tools.web.betas)
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
                raise StepFailed(over_budget(cost, job.budget), retryable=False)
            left = job.budget - cost if job.budget is not None else None
            sink.begin_turn()  # the run's budget: no turn begins once it is spent
            # A readied sibling's first request waits for its lead's reply (claude_ready).
            hold = job.hold if number == 1 else None
            turn = self._turn_with_retries(params, sink, job, deadline, price, left, hold)
            cost += turn.cost(price) if price else 0.0
            if tools.web.names:  # what the API's server tools did this turn
                record_server_uses(sink, turn.blocks, turn.web_searches, turn.web_fetches, price)
            if turn.text:
                texts.append("".join(turn.text).strip())
            messages.append({"role": "assistant", "content": turn.blocks})
            if turn.stop == "pause_turn":  # the API paused its server tools' loop: sent back, it goes on
                continue
            if turn.stop != "tool_use" or not turn.tool_uses:
                late = late_notes(tools, may_go_on=number < max_turns and turn.stop == "end_turn")
                if late:  # a colleague's message came while it finished: it hears it before it ends
                    messages.append({"role": "user", "content": late})
                    continue
                return StepOutcome(
                    result="\n\n".join(t for t in texts if t), conclusion="".join(turn.text).strip(), cost_usd=cost, turns=number
                )
            results: list[dict[str, Any]] = [self._tool_result(use, tools, bool(tool_defs), sink) for use in turn.tool_uses]
            # Colleagues' messages (and answers) that came meanwhile join the next turn.
            messages.append({"role": "user", "content": results + text_blocks(tools.colleagues.pending())})
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

    # -- one turn, with retries of what is not the step's fault ---------------------------

    def _turn_with_retries(
        self,
        params: dict[str, Any],
        sink: ExecutionSink,
        job: StepJob,
        deadline: float | None,
        price: Any,
        left: float | None,
        hold: str | None = None,
    ) -> Turn:
        for tried in range(self.api_retries + 1):
            try:
                return self._turn(params, sink, job, deadline, price, left, hold if tried == 0 else None)
            except REFUSALS as exc:
                raise refusal(exc, job.model) from None
            except RETRYABLE as exc:
                what = describe(exc)
                if tried == self.api_retries:
                    raise StepFailed(f"the model API failed {tried + 1} times: {what}", retryable=True) from None
                wait = retry_after(exc) or self.backoff_s * (2**tried)
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

    def _held(self, params: dict[str, Any], sink: ExecutionSink, job: StepJob, deadline: float | None, hold: str) -> Any:
        """A readied sibling's request: built now, held until its lead's reply, then ready to
        send (None: the turn goes through the SDK once released)."""
        ready = ReadyRequest.build(self.client, self._http, params, _time_left(deadline, job))
        wait_at_gate(hold, sink)
        if sink.stopped():
            raise StepStopped(STOPPED_BEFORE_REPLY)
        if deadline:  # the wait counted against the step's timeout: the request is given what is left
            ready = ReadyRequest.build(self.client, self._http, params, _time_left(deadline, job))
        return ready

    def _open(self, ready: ReadyRequest | None, params: dict[str, Any], timeout: float | None) -> Any:
        """Start one turn's stream: the readied request as it was built, or through the SDK."""
        stream = ready.send(self.client) if ready is not None else None
        return stream if stream is not None else self._create(params, timeout)

    def _turn(
        self,
        params: dict[str, Any],
        sink: ExecutionSink,
        job: StepJob,
        deadline: float | None,
        price: Any,
        left: float | None,
        hold: str | None = None,
    ) -> Turn:
        ready = self._held(params, sink, job, deadline, hold) if hold else None
        timeout = _time_left(deadline, job)
        reader = TurnReader(model=params["model"], price=price, left=left)
        turn = reader.turn
        watch = CallWatch(sink, self._watcher).start()
        reader.sent = lambda: watch.sent
        try:
            with self._sockets.calling(watch):
                stream = self._open(ready, params, timeout)
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


def _time_left(deadline: float | None, job: StepJob) -> float | None:
    """Seconds a turn may still take before the step's `timeout:` (None: no timeout)."""
    if not deadline:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise StepFailed(f"timed out after {job.timeout:g} s", retryable=False)
    return left


def _stopped_reason(turn: Turn) -> str:
    return "stopped by a person" if turn.id else STOPPED_BEFORE_REPLY
