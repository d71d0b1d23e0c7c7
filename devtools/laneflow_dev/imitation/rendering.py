"""A reply as the Messages API says it: its content blocks, each with the pieces its deltas
carry (text in chunks of a few words, a tool_use's input JSON in 16-character pieces), cut at
``max_tokens``; its stop reason and output tokens; the Message it starts as; and the
server-sent events of its stream, in the real order. The server tools' blocks (web.py) come
first: a ``server_tool_use`` streams its input as a tool_use does, a result block comes whole
at its start; the text's citations stream as ``citations_delta`` before its text."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from laneflow_dev.imitation.handler import new_id
from laneflow_dev.imitation.prompt import canonical
from laneflow_dev.imitation.replies import Reply
from laneflow_dev.imitation.web import Served

# A content block, with the pieces its deltas carry.
Blocks = list[tuple[dict[str, Any], list[str]]]


def count_tokens(text: str, chars_per_token: int) -> int:
    return math.ceil(len(text) / chars_per_token)


def render(reply: Reply, max_tokens: int, chars_per_token: int, served: Served | None = None) -> tuple[Blocks, str, int]:
    """The reply's content blocks, each with its delta pieces (the server tools' `served`
    first); its stop reason; its output tokens (cut at max_tokens)."""
    blocks: Blocks = list(served.blocks) if served else []
    budget = max_tokens - (served.output_tokens if served else 0)
    text = reply.text or ""
    truncated = False
    if count_tokens(text, chars_per_token) > max(budget, 0):
        text = text[: max(budget, 0) * chars_per_token]
        truncated = True
    used = count_tokens(text, chars_per_token)
    if text or not reply.tool_uses:
        block: dict[str, Any] = {"type": "text", "text": text}
        if served and served.citations and text:
            block["citations"] = list(served.citations)
        blocks.append((block, word_chunks(text)))
    if not truncated:
        for call in reply.tool_uses:
            name = str(call.get("name", "tool"))
            tool_input = call.get("input") or {}
            cost = count_tokens(name + canonical(tool_input), chars_per_token)
            if used + cost > budget:
                truncated = True
                break
            used += cost
            raw = json.dumps(tool_input)
            pieces = [""] + [raw[i : i + 16] for i in range(0, len(raw), 16)]
            block = {"type": "tool_use", "id": call.get("id") or new_id("toolu_"), "name": name, "input": tool_input}
            blocks.append((block, pieces))
    if truncated:
        stop_reason = "max_tokens"
    else:
        stop_reason = reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn")
    return blocks, stop_reason, max(used + (served.output_tokens if served else 0), 1)


def new_message(model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The Message a reply starts as: no content and no stop reason yet."""
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def stream_events(
    message: dict[str, Any], blocks: Blocks, stop_reason: str, output_tokens: int, pace: Callable[[str], None]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream's events (name, data): ``message_start``, per block ``content_block_start``
    / ``content_block_delta`` / ``content_block_stop``, a ``ping`` after the first block start,
    ``message_delta``, ``message_stop``. `pace` is called with each delta's piece before it
    is yielded (the output's time)."""
    start_usage = {k: v for k, v in message["usage"].items() if k != "server_tool_use"}  # counted by its end
    yield "message_start", {"type": "message_start", "message": dict(message, usage=dict(start_usage, output_tokens=1))}
    for index, (block, pieces) in enumerate(blocks):
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": _shell(block)}
        if index == 0:
            yield "ping", {"type": "ping"}
        for citation in (block.get("citations") or []) if block["type"] == "text" else []:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": _cited(citation)}
        for piece in pieces:
            if block["type"] == "text":
                delta = {"type": "text_delta", "text": piece}
            else:
                delta = {"type": "input_json_delta", "partial_json": piece}
            pace(piece)
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **_server_usage(message["usage"])},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _shell(block: dict[str, Any]) -> dict[str, Any]:
    """What a block's `content_block_start` carries: a text or a tool use empty (their
    deltas follow), a server tool's result whole."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] in ("tool_use", "server_tool_use"):
        return {"type": block["type"], "id": block["id"], "name": block["name"], "input": {}}
    return block


def _cited(citation: dict[str, Any]) -> dict[str, Any]:
    return {"type": "citations_delta", "citation": citation}


def _server_usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {"server_tool_use": usage["server_tool_use"]} if "server_tool_use" in usage else {}


def word_chunks(text: str, words: int = 3) -> list[str]:
    """Text in chunks of a few words (whitespace kept, so the chunks join back exactly)."""
    if not text:
        return []
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i : i + words]) for i in range(0, len(tokens), words)]
