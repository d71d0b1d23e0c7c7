"""The server tools the imitation runs itself, as the API does: `web_search_20250305` and
`web_fetch_20250910` (under the beta header `web-fetch-2025-09-10`).

- A typed tool definition is checked as the API checks it (a 400 naming the field): a type
  it knows, the name that type takes, its fields only, `max_uses` a whole number from 1.
- A reply's server uses (``Reply.server_uses``) become, in the same response, a
  ``server_tool_use`` block and its result block each: a search's pretend pages naming its
  query, a fetch's pretend document naming its URL (which must be in the conversation
  before, as the API requires: else ``url_not_in_prior_context``). Past a tool's
  ``max_uses`` in the request, the result is the error ``max_uses_exceeded``; input that is
  not what the tool takes is ``invalid_tool_input``.
- The reply's text then cites the first page of each search (``web_search_result_location``)
  and, where citations are on, each fetched document (``char_location``).
- Only the uses made are counted (``usage.server_tool_use``); the results' text counts as
  input tokens of the request, the uses' names and inputs as output tokens.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from laneflow_dev.imitation.handler import new_id
from laneflow_dev.imitation.prompt import RequestError, canonical

WEB_SEARCH_TYPE = "web_search_20250305"

WEB_FETCH_TYPE = "web_fetch_20250910"

WEB_FETCH_BETA = "web-fetch-2025-09-10"

COMMON_FIELDS = {"type", "name", "max_uses", "allowed_domains", "blocked_domains", "cache_control"}

# type -> (the name it takes, its fields beyond the common ones, the beta header it needs)
SERVER_TOOLS: dict[str, tuple[str, set[str], str | None]] = {
    WEB_SEARCH_TYPE: ("web_search", {"user_location"}, None),
    WEB_FETCH_TYPE: ("web_fetch", {"citations", "max_content_tokens"}, WEB_FETCH_BETA),
}

RESULT_TYPE = {"web_search": "web_search_tool_result", "web_fetch": "web_fetch_tool_result"}

SEARCH_RESULTS = 3

# A content block, with the pieces its deltas carry (as rendering.py's `Blocks`).
Blocks = list[tuple[dict[str, Any], list[str]]]


def _check_int(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{where}: Input should be a valid integer")
    if value < 1:
        raise RequestError(400, f"{where}: Input should be greater than or equal to 1")


def _check_server_tool(i: int, tool: dict[str, Any], betas: set[str]) -> None:
    kind = tool["type"]
    name, own, beta = SERVER_TOOLS[kind]
    where = f"tools.{i}.{kind}"
    if tool.get("name") != name:
        raise RequestError(400, f"{where}.name: Input should be '{name}'")
    for key in sorted(tool):
        if key not in COMMON_FIELDS | own:
            raise RequestError(400, f"{where}.{key}: Extra inputs are not permitted")
    if "max_uses" in tool and tool["max_uses"] is not None:
        _check_int(tool["max_uses"], f"{where}.max_uses")
    if "max_content_tokens" in tool and tool["max_content_tokens"] is not None:
        _check_int(tool["max_content_tokens"], f"{where}.max_content_tokens")
    if tool.get("allowed_domains") and tool.get("blocked_domains"):
        raise RequestError(400, f"{where}: allowed_domains and blocked_domains cannot be used together")
    citations = tool.get("citations")
    if citations is not None and not (isinstance(citations, dict) and isinstance(citations.get("enabled"), bool)):
        raise RequestError(400, f"{where}.citations.enabled: Input should be a valid boolean")
    if beta and beta not in betas:
        raise RequestError(400, f"{where}: the {name} tool takes the beta header anthropic-beta: {beta}")


def validate_tools(body: dict[str, Any], betas: set[str]) -> None:
    """The request's typed tool definitions, as the API takes them (a 400 naming the field).
    A definition without a type (or `custom`) is a client tool: not checked here."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        return  # analyze_prompt says so
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") in (None, "custom"):
            continue
        if tool["type"] not in SERVER_TOOLS:
            expected = ", ".join(f"'{t}'" for t in ("custom", *SERVER_TOOLS))
            raise RequestError(
                400,
                f"tools.{i}: Input tag {tool['type']!r} found using 'type' does not match any of the expected tags: {expected}",
            )
        _check_server_tool(i, tool, betas)


def server_tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request's server tools by name (their definitions)."""
    tools = body.get("tools") or []
    return {
        str(t["name"]): t
        for t in tools
        if isinstance(t, dict) and t.get("type") in SERVER_TOOLS and isinstance(t.get("name"), str)
    }


@dataclass
class Served:
    """What a reply's server uses came to: their blocks, the citations of its text, the
    requests made, and their tokens."""

    blocks: Blocks = field(default_factory=list)
    citations: list[dict[str, Any]] = field(default_factory=list)
    searches: int = 0
    fetches: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def usage(self) -> dict[str, int]:
        return {"web_search_requests": self.searches, "web_fetch_requests": self.fetches}


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1e".join(parts).encode("utf-8")).hexdigest()[:24]


def _search(query: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A search's pretend pages, and the citation of its first."""
    pages = [
        {
            "type": "web_search_result",
            "url": f"https://example.com/search/{n}?q={quote(query, safe='')}",
            "title": f"{query} - result {n}",
            "encrypted_content": _digest("page", query, str(n)),
            "page_age": None,
        }
        for n in range(1, SEARCH_RESULTS + 1)
    ]
    first = pages[0]
    citation = {
        "type": "web_search_result_location",
        "url": first["url"],
        "title": first["title"],
        "encrypted_index": _digest("index", query),
        "cited_text": f"What the web says about {query}.",
    }
    return pages, citation


def _fetch(url: str, index: int, citations_on: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    text = f"The page at {url} says what it says."
    title = f"Page at {url}"
    document: dict[str, Any] = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": text},
        "title": title,
    }
    if citations_on:
        document["citations"] = {"enabled": True}
    content = {"type": "web_fetch_result", "url": url, "retrieved_at": "2026-01-01T00:00:00Z", "content": document}
    citation = None
    if citations_on:
        citation = {
            "type": "char_location",
            "cited_text": text,
            "document_index": index,
            "document_title": title,
            "start_char_index": 0,
            "end_char_index": len(text),
        }
    return content, citation


def _error(name: str, code: str) -> dict[str, Any]:
    return {"type": f"{RESULT_TYPE[name]}_error", "error_code": code}


class _Serving:
    """One request's server uses, in order, counted against each tool's max_uses."""

    def __init__(self, tools: dict[str, dict[str, Any]], body: dict[str, Any], chars_per_token: int):
        self.tools, self.chars_per_token = tools, chars_per_token
        self.seen = canonical(body.get("messages") or [])  # what a fetch's URL must be in
        self.used: dict[str, int] = {}
        self.documents = 0
        self.served = Served()

    def _result(self, name: str, tool_input: dict[str, Any]) -> Any:
        limit = self.tools[name].get("max_uses")
        self.used[name] = self.used.get(name, 0) + 1
        if limit is not None and self.used[name] > limit:
            return _error(name, "max_uses_exceeded")
        if name == "web_search":
            query = tool_input.get("query")
            if not isinstance(query, str) or not query.strip():
                return _error(name, "invalid_tool_input")
            pages, citation = _search(query.strip())
            self.served.searches += 1
            self.served.citations.append(citation)
            self.seen += canonical(pages)
            return pages
        url = tool_input.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return _error(name, "invalid_tool_input")
        if url not in self.seen:
            return _error(name, "url_not_in_prior_context")
        citations_on = bool((self.tools[name].get("citations") or {}).get("enabled"))
        content, cited = _fetch(url, self.documents, citations_on)
        self.documents += 1
        self.served.fetches += 1
        if cited:
            self.served.citations.append(cited)
        return content

    def use(self, name: str, tool_input: dict[str, Any]) -> None:
        use_id = new_id("srvtoolu_")
        raw = canonical(tool_input)
        pieces = [""] + [raw[i : i + 16] for i in range(0, len(raw), 16)]
        self.served.blocks.append(({"type": "server_tool_use", "id": use_id, "name": name, "input": tool_input}, pieces))
        result = {"type": RESULT_TYPE[name], "tool_use_id": use_id, "content": self._result(name, tool_input)}
        self.served.blocks.append((result, []))
        self.served.output_tokens += math.ceil(len(name + raw) / self.chars_per_token)
        self.served.input_tokens += math.ceil(len(canonical(result["content"])) / self.chars_per_token)


def serve(uses: list[dict[str, Any]], body: dict[str, Any], chars_per_token: int) -> Served:
    """A reply's server uses (each {"name", "input"}) run as the API runs them; a use of a
    tool the request does not carry is left out."""
    tools = server_tools(body)
    serving = _Serving(tools, body, chars_per_token)
    for use in uses:
        name = str(use.get("name", ""))
        if name in tools and name in RESULT_TYPE:
            tool_input = use.get("input")
            serving.use(name, tool_input if isinstance(tool_input, dict) else {})
    return serving.served
