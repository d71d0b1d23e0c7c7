"""Anthropic's server tools, `web_search` and `web_fetch` (agent.md `tools:`): definitions in
the request, run by the API, never by laneflow.

- A granted tool is sent as its definition (`web_search_20250305`; `web_fetch_20250910`
  with its citations on, under the beta header `web-fetch-2025-09-10`), each with the
  agent's `web_max_uses` as its `max_uses`: the uses of that tool one request (one model
  turn) may make. Past it the API answers the use with the error `max_uses_exceeded`.
- Each use the API made is recorded as a tool call of the step (its name, its input, and its
  result summed up: the pages' titles and URLs, or the API's error code), masked and
  captured like any tool's; the turn's server-tool requests, their price and the citations
  of its text are one `web` event.
- The stub's `tool: web_search` / `tool: web_fetch` lines get a pretend result
  (`domain.stub_answers.pretend_web`), counted against `max_uses` and recorded the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from laneflow.domain.pricing import catalog
from laneflow.domain.records import EventType
from laneflow.domain.stub_answers import pretend_web
from laneflow.domain.tools import WEB_FETCH, WEB_SEARCH, web_tools
from laneflow.ports import ExecutionSink, StepJob

WEB_SEARCH_TYPE = "web_search_20250305"

WEB_FETCH_TYPE = "web_fetch_20250910"

WEB_FETCH_BETA = "web-fetch-2025-09-10"

SERVER_TOOL_USE = "server_tool_use"

RESULT_TYPES = {"web_search_tool_result": WEB_SEARCH, "web_fetch_tool_result": WEB_FETCH}

MAX_TITLE_CHARS = 300

MAX_CITED_CHARS = 500


@dataclass
class WebUse:
    """One use of a web tool and what came of it: the pages (title, URL) or the error code."""

    name: str
    input: dict[str, Any]
    pages: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    answered: bool = True  # False: its result was not in the turn (the API paused it)

    def summary(self) -> str:
        if not self.answered:
            return "no result in this turn"
        if self.error:
            return f"error: {self.error}"
        if not self.pages:
            return "no results"
        return "\n".join(f"{n}. {title}\n   {url}" for n, (title, url) in enumerate(self.pages, start=1))


def _pages(name: str, content: Any) -> tuple[list[tuple[str, str]], str | None]:
    """A result block's content: (pages, error code)."""
    if isinstance(content, dict) and str(content.get("type", "")).endswith("_error"):
        return [], str(content.get("error_code") or "unknown")
    if name == WEB_SEARCH:
        items = content if isinstance(content, list) else []
        return [
            (str(i.get("title") or "")[:MAX_TITLE_CHARS], str(i.get("url") or "")) for i in items if isinstance(i, dict)
        ], None
    if isinstance(content, dict):
        document = content.get("content")
        title = document.get("title") if isinstance(document, dict) else None
        return [(str(title or "")[:MAX_TITLE_CHARS], str(content.get("url") or ""))], None
    return [], None


def uses_of(blocks: list[dict[str, Any]]) -> list[WebUse]:
    """The web tools' uses in a turn's content, each with its result block's pages."""
    results = {b.get("tool_use_id"): b for b in blocks if b.get("type") in RESULT_TYPES}
    uses = []
    for block in blocks:
        if block.get("type") != SERVER_TOOL_USE or block.get("name") not in (WEB_SEARCH, WEB_FETCH):
            continue
        use = WebUse(name=block["name"], input=dict(block.get("input") or {}))
        result = results.get(block.get("id"))
        if result is None:
            use.answered = False
        else:
            use.pages, use.error = _pages(use.name, result.get("content"))
        uses.append(use)
    return uses


def citations_of(blocks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The citations of a turn's text blocks: where each cited text is from (URL, title) and
    the text."""
    found = []
    for block in blocks:
        if block.get("type") != "text":
            continue
        for citation in block.get("citations") or []:
            if not isinstance(citation, dict):
                continue
            title = citation.get("title") or citation.get("document_title")
            entry = {"type": str(citation.get("type", "")), "url": citation.get("url"), "title": title}
            entry["cited_text"] = str(citation.get("cited_text") or "")[:MAX_CITED_CHARS]
            found.append({k: str(v) for k, v in entry.items() if v is not None})
    return found


def record_use(sink: ExecutionSink, use: WebUse) -> str:
    """One use, recorded as the step's tool call; its summary is returned."""
    summary = use.summary()
    sink.tool_call(use.name, json.dumps(use.input, ensure_ascii=False), summary, is_error=bool(use.error))
    return summary


def record_turn(sink: ExecutionSink, *, searches: int, fetches: int, cost: float, citations: list[dict[str, str]]) -> None:
    """A turn's server-tool requests (as the API's usage counts them), their price and the
    citations of its text, as one `web` event (none when the turn had none of them)."""
    if not (searches or fetches or citations):
        return
    parts = [
        f"{searches} web search{'es' if searches != 1 else ''} (${cost:.4f})",
        f"{fetches} fetch{'es' if fetches != 1 else ''}",
    ]
    cited = sorted({c["url"] for c in citations if c.get("url")})
    text = "web: " + ", ".join(parts) + (f"; cites {', '.join(cited)}" if cited else "")
    data = {"web_search_requests": searches, "web_fetch_requests": fetches, "cost_usd": round(cost, 8), "citations": citations}
    sink.event(EventType.info, text, data)


class WebTools:
    """A step's web tools: their definitions, the beta header they need, and the stub's
    pretend uses (counted a request, as the API counts them)."""

    def __init__(self, job: StepJob):
        self.names = web_tools(job.tools)
        self.max_uses = job.web_max_uses
        self._used: dict[str, int] = {}  # uses asked for in this request
        self._made: dict[str, int] = {}  # of them, the requests made (within max_uses)

    def definitions(self) -> list[dict[str, Any]]:
        defs: list[dict[str, Any]] = []
        if WEB_FETCH in self.names:
            defs.append({"type": WEB_FETCH_TYPE, "name": WEB_FETCH, "max_uses": self.max_uses, "citations": {"enabled": True}})
        if WEB_SEARCH in self.names:
            defs.append({"type": WEB_SEARCH_TYPE, "name": WEB_SEARCH, "max_uses": self.max_uses})
        return defs

    @property
    def betas(self) -> list[str]:
        return [WEB_FETCH_BETA] if WEB_FETCH in self.names else []

    def pretend(self, name: str, raw: str, sink: ExecutionSink) -> str:
        """A stub's use: its pretend result (past `max_uses` in this request, the API's
        `max_uses_exceeded`), recorded as a real use is."""
        self._used[name] = self._used.get(name, 0) + 1
        try:
            shown = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            shown = None
        use = WebUse(name=name, input=shown if isinstance(shown, dict) else {"unreadable_input": raw[:2000]})
        if self._used[name] > self.max_uses:
            use.error = "max_uses_exceeded"
        else:
            pretend = pretend_web(name, raw)
            use.pages, use.error = list(pretend.pages), pretend.error
            if not use.error:
                self._made[name] = self._made.get(name, 0) + 1
        return record_use(sink, use)

    def end_request(self, sink: ExecutionSink) -> float:
        """The stub's request ends: its web event, and what its searches cost (the catalog's
        price); the count starts again for the next."""
        searches, fetches = self._made.get(WEB_SEARCH, 0), self._made.get(WEB_FETCH, 0)
        self._used, self._made = {}, {}
        cost = catalog().server_tools_cost(searches, fetches)
        record_turn(sink, searches=searches, fetches=fetches, cost=cost, citations=[])
        return cost


def record_server_uses(sink: ExecutionSink, blocks: list[dict[str, Any]], searches: int, fetches: int, price: Any) -> None:
    """A Claude turn's server-tool uses, each as a tool call, and its `web` event (the
    requests the usage counted, their price, the citations of its text)."""
    for use in uses_of(blocks):
        record_use(sink, use)
    cost = price.server_tools_cost(searches, fetches) if price else 0.0
    record_turn(sink, searches=searches, fetches=fetches, cost=cost, citations=citations_of(blocks))
