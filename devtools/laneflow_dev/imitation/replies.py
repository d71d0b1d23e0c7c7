"""What the imitation answers: a reply per request, by default scripted by the last user
message's directives (``[[tool NAME JSON]]`` lines, ``[[reply TEXT]]``): a directive naming a
server tool the request carries (web_search, web_fetch: web.py) is a use the imitation runs
itself, in the same response."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from laneflow_dev.imitation.asked_json import ASKS_FOR_JSON, json_reply
from laneflow_dev.imitation.web import server_tools


@dataclass
class Reply:
    """One assistant turn the server will send."""

    text: str = ""
    tool_uses: list[dict[str, Any]] = field(default_factory=list)  # each {"name": str, "input": dict}
    # Server tools' uses, run by the imitation before the text (web.py), each {"name", "input"}.
    server_uses: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None  # default: "tool_use" if tool_uses else "end_turn"


Responder = Callable[[dict[str, Any]], Reply]


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


def _parse_script(text: str) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """(tool directives in order, the [[reply]] text or None, the other lines)."""
    tools: list[dict[str, Any]] = []
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


def default_responder(body: dict[str, Any]) -> Reply:
    """Scriptable without Python. In the FIRST user message, lines ``[[tool NAME {json}]]``
    script tool calls: on the k-th assistant turn (k = assistant messages already present)
    the k-th directive, if any, is answered with "Calling NAME." plus that tool_use.
    Otherwise the final text is ``Reply to: <first line of the first user message, without
    directives>`` and ``Turn <k+1>.``, or the text of a ``[[reply TEXT]]`` directive
    (``\\n`` escapes allowed). Directives naming a server tool the request carries are run by
    the imitation in the same response, with the next client directive or the final text. A message that asks for its result as JSON in a fenced block
    (laneflow's `output: json` hint) gets one, matching the JSON Schema it gives
    (`asked_json`), as a model that follows its instructions would answer."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    text = _text_of(first_user.get("content")) if first_user else ""
    tools, reply, rest = _parse_script(text)
    assistant = [m for m in messages if m.get("role") == "assistant"]
    k = len(assistant)
    # The next directive: one a turn, or as many as an earlier turn used (server uses too).
    at = k + sum(max(0, _uses_in(m.get("content")) - 1) for m in assistant)
    server = server_tools(body)
    uses: list[dict[str, Any]] = []
    while at < len(tools) and tools[at]["name"] in server:  # served in this response, as the API does
        uses.append(tools[at])
        at += 1
    if at < len(tools):
        call = tools[at]
        return Reply(text=f"Calling {call['name']}.", tool_uses=[call], server_uses=uses)
    if reply is not None:
        return Reply(text=reply, server_uses=uses)
    first_line = next((line.strip() for line in rest if line.strip()), "")
    if ASKS_FOR_JSON in text:
        return Reply(text=json_reply(text, first_line), server_uses=uses)
    return Reply(text=f"Reply to: {first_line}\nTurn {k + 1}.", server_uses=uses)


def _uses_in(content: Any) -> int:
    """The tool uses (a client's and a server's) of an assistant message's content."""
    if not isinstance(content, list):
        return 0
    return sum(1 for b in content if isinstance(b, dict) and b.get("type") in ("tool_use", "server_tool_use"))
