"""Reading one Claude turn's stream: its events, one at a time, into a `Turn` (text, tool_use
blocks, usage, stop reason, time to first token), its model-call span, and the agent's budget
checked as it goes.

A server tool's blocks (`server_tool_use`, its input streamed like a tool_use's; a
`web_search_tool_result` or `web_fetch_tool_result`, whole at its start) and a text block's
citations are kept as they came, to be sent back in the assistant message; the usage's
`server_tool_use` requests are priced with the turn."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from laneflow.adapters.executors.web import RESULT_TYPES
from laneflow.domain.errors import StepFailed
from laneflow.domain.records import ModelCall, Tokens, utcnow
from laneflow.ports import ExecutionSink

UNREADABLE_INPUT = "unreadable_input"  # the key a tool_use input that was not a JSON object is kept under


@dataclass
class Turn:
    id: str = ""
    text: list[str] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop: str | None = None
    tokens: Tokens = field(default_factory=Tokens)
    ttft_ms: int | None = None
    web_searches: int = 0  # usage.server_tool_use: the requests the API made for the turn
    web_fetches: int = 0

    def cost(self, price: Any, tokens: Tokens | None = None) -> float:
        """The turn's price: its tokens (or those given) and its server-tool requests."""
        tokens = self.tokens if tokens is None else tokens
        return float(price.cost(tokens, web_searches=self.web_searches, web_fetches=self.web_fetches))

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b["type"] == "tool_use"]


class TurnReader:
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
        self.sent: Callable[[], float | None] = lambda: None  # when its request was written whole (monotonic)

    def span(self) -> ModelCall:
        turn = self.turn
        return ModelCall(
            id=turn.id or f"turn-{self.at}",
            at=self.at,
            ms=int((time.monotonic() - self.started) * 1000),
            ttft_ms=turn.ttft_ms,
            sent_ms=int((sent - self.started) * 1000) if (sent := self.sent()) is not None else None,
            model=self.model,
            tokens=turn.tokens,
            tools=len(turn.tool_uses),
            stop=turn.stop,
            cost_usd=round(turn.cost(self.price), 8) if self.price else 0.0,
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
        if self.left is not None and self.price and self.turn.cost(self.price, tokens) >= self.left:
            self.turn.tokens = tokens
            raise StepFailed(over_budget(self.turn.cost(self.price), self.left), retryable=False)

    def _message_start(self, event: Any, sink: ExecutionSink) -> None:
        sink.first_event()
        usage = event.message.usage
        self.turn.id = event.message.id
        self.turn.tokens = Tokens(
            input=usage.input_tokens or 0,
            output=usage.output_tokens or 0,
            cache_read=getattr(usage, "cache_read_input_tokens", 0) or 0,
            cache_write=getattr(usage, "cache_creation_input_tokens", 0) or 0,
            # The 1-hour part of the write (`usage.cache_creation`), priced at the 1-hour price.
            cache_write_1h=getattr(getattr(usage, "cache_creation", None), "ephemeral_1h_input_tokens", 0) or 0,
        )
        self._server_usage(usage)
        sink.call(self.span())
        self._check_budget(self.turn.tokens)

    def _block_start(self, event: Any, sink: ExecutionSink) -> None:
        block = event.content_block
        if block.type in ("tool_use", "server_tool_use"):
            self.turn.blocks.append({"type": block.type, "id": block.id, "name": block.name, "input": {}})
            self.json_parts[event.index] = []
        elif block.type in RESULT_TYPES:  # a server tool's result: whole, kept as it came
            self.turn.blocks.append(block.to_dict())
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
        elif delta.type == "citations_delta" and turn.blocks and turn.blocks[-1]["type"] == "text":
            turn.blocks[-1].setdefault("citations", []).append(delta.citation.to_dict())
        elif delta.type == "input_json_delta":
            self.json_parts.setdefault(event.index, []).append(delta.partial_json)
            self.out_chars += len(delta.partial_json)
        if self.left is not None and self.price:
            self._check_budget(turn.tokens.model_copy(update={"output": max(turn.tokens.output, self.out_chars // 4)}))

    def _block_stop(self, event: Any, sink: ExecutionSink) -> None:
        turn = self.turn
        if event.index in self.json_parts and turn.blocks and turn.blocks[-1]["type"] in ("tool_use", "server_tool_use"):
            turn.blocks[-1]["input"] = tool_input("".join(self.json_parts.pop(event.index)))

    def _message_delta(self, event: Any, sink: ExecutionSink) -> None:
        self.turn.stop = event.delta.stop_reason
        if event.usage and event.usage.output_tokens is not None:
            self.turn.tokens = self.turn.tokens.model_copy(update={"output": event.usage.output_tokens})
        if event.usage:
            self._server_usage(event.usage)

    def _server_usage(self, usage: Any) -> None:
        """The server tools' requests so far, as the usage counts them (a count only grows)."""
        server = getattr(usage, "server_tool_use", None)
        if server is not None:
            self.turn.web_searches = max(self.turn.web_searches, getattr(server, "web_search_requests", 0) or 0)
            self.turn.web_fetches = max(self.turn.web_fetches, getattr(server, "web_fetch_requests", 0) or 0)


def tool_input(raw: str) -> dict[str, Any]:
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


def over_budget(spent: float, left: float) -> str:
    return f"stopped at its budget: ${left:.4f} was left for this step and the model had spent ${spent:.4f}"
