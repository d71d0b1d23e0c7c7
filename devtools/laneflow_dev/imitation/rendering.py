"""A reply as the Messages API says it: its content blocks, each with the pieces its deltas
carry (text in chunks of a few words, a tool_use's input JSON in 16-character pieces), cut at
``max_tokens``; its stop reason and output tokens; the Message it starts as; and the
server-sent events of its stream, in the real order."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from laneflow_dev.imitation.handler import new_id
from laneflow_dev.imitation.prompt import canonical
from laneflow_dev.imitation.replies import Reply

# A content block, with the pieces its deltas carry.
Blocks = list[tuple[dict[str, Any], list[str]]]


def count_tokens(text: str, chars_per_token: int) -> int:
    return math.ceil(len(text) / chars_per_token)


def render(reply: Reply, max_tokens: int, chars_per_token: int) -> tuple[Blocks, str, int]:
    """The reply's content blocks, each with its delta pieces; its stop reason; its
    output tokens (cut at max_tokens)."""
    blocks: Blocks = []
    budget = max_tokens
    text = reply.text or ""
    truncated = False
    if count_tokens(text, chars_per_token) > budget:
        text = text[: budget * chars_per_token]
        truncated = True
    used = count_tokens(text, chars_per_token)
    if text or not reply.tool_uses:
        blocks.append(({"type": "text", "text": text}, word_chunks(text)))
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
    return blocks, stop_reason, max(used, 1)


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
    start_usage = dict(message["usage"], output_tokens=1)
    yield "message_start", {"type": "message_start", "message": dict(message, usage=start_usage)}
    for index, (block, pieces) in enumerate(blocks):
        shell: dict[str, Any]
        if block["type"] == "text":
            shell = {"type": "text", "text": ""}
        else:
            shell = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": shell}
        if index == 0:
            yield "ping", {"type": "ping"}
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
            "usage": {"output_tokens": output_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def word_chunks(text: str, words: int = 3) -> list[str]:
    """Text in chunks of a few words (whitespace kept, so the chunks join back exactly)."""
    if not text:
        return []
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i : i + words]) for i in range(0, len(tokens), words)]
