"""The stub model's answers (an agent's `stub:`): picking the k-th, reading its header lines
(`cost:`, `ttft_ms:`, `delay_ms:`, `fail:`), its `call:` lines (pretend tool calls), its
`tool: NAME {JSON}` lines (real calls of the step's tools) and its `===` turns, and the
bounds a header value must keep.

The answer's `cost:` is charged on its final turn (with one turn, the attempt's price). A
turn after a `===` line may open with a `cost:` line of its own, charged on that turn, so a
step's spend grows turn by turn as a model's does (the run's budget is checked before each
turn): the attempt costs the answer's `cost:` and every turn's together.

A `tool: web_search {"query": ...}` or `tool: web_fetch {"url": ...}` line of an agent granted
that web tool gets a pretend result (`pretend_web`): pages naming the query or the URL, or the
error code the API would answer (`invalid_tool_input`), whatever follows the name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import quote

from laneflow.domain import jsonsafe

HEADERS = ("cost", "ttft_ms", "delay_ms", "fail")

# Bounds of the headers' values: a pretend price past a million dollars, or a simulated
# latency past ten minutes, is a typo, not a test (and `inf` would never end).
MAX_COST_USD = 1_000_000

MAX_SIMULATED_MS = 600_000

_PRICE = re.compile(r"^\+?(?:[0-9]{1,15}(?:\.[0-9]{0,15})?|\.[0-9]{1,15})(?:[eE][+-]?[0-9]{1,3})?$")

_MILLISECONDS = re.compile(r"^\+?[0-9]{1,9}$")

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")

_HEADER = re.compile(r"^\s*(cost|ttft_ms|delay_ms|fail)\s*:\s*(.*?)\s*$")

_CALL = re.compile(r"^\s*call:\s*(\S+)\s*(.*?)\s*(?:=>\s*(.*?))?\s*$")

_TOOL = re.compile(r"^\s*tool:\s*(\S+)\s*(.*?)\s*$")

_TURN_BREAK = re.compile(r"^\s*===\s*$")

_TURN_COST = re.compile(r"^\s*cost\s*:\s*(.*?)\s*$")


@dataclass
class StubCall:
    """A tool call of a stub turn: pretend (`call:`, its output as written) or, when `real`,
    a `tool:` line whose `input` (JSON text) is given to the step's real tool."""

    tool: str
    input: str
    output: str
    real: bool = False


@dataclass
class StubTurn:
    text: str
    calls: list[StubCall] = field(default_factory=list)
    cost: float = 0.0  # the turn's own `cost:` line (right after its `===`)


@dataclass
class StubAnswer:
    turns: list[StubTurn]
    cost: float = 0.0
    ttft_ms: int = 0
    delay_ms: int = 0
    fail: str | None = None

    @property
    def total_cost(self) -> float:
        """What the attempt costs: the answer's `cost:` and every turn's own."""
        return round(self.cost + sum(t.cost for t in self.turns), 6)


def pick_answer(stub: str | list[str] | None, k: int, default: str) -> str:
    """The k-th answer (0-based) of a step position; the last one repeats."""
    if stub is None or stub == []:
        return default
    if isinstance(stub, str):
        return stub
    return stub[min(k, len(stub) - 1)]


class BadHeader(ValueError):
    """A header line of a stub answer whose value cannot be used: which header, on which
    line of the answer (0-based), and why."""

    def __init__(self, header: str, line: int, message: str):
        self.header, self.line = header, line
        super().__init__(f"{header}: {message}")


def header_value(name: str, text: str, line: int = 0) -> float | int | str:
    """A header's value, checked: `cost` a price in USD from 0 to MAX_COST_USD, `ttft_ms`
    and `delay_ms` whole milliseconds from 0 to MAX_SIMULATED_MS, `fail` any text.
    Raises `BadHeader` saying what it takes."""
    if name == "fail":
        return text
    shown = text if len(text) <= 40 else text[:40] + "…"
    if name == "cost":
        value = float(text) if _PRICE.match(text) else math.nan
        if not 0 <= value <= MAX_COST_USD:
            raise BadHeader(
                name, line, f"{shown!r} is not a price; write a number of USD from 0 to {MAX_COST_USD:,}, such as 0.25"
            )
        return value
    value_ms = int(text) if _MILLISECONDS.match(text) else -1
    if not 0 <= value_ms <= MAX_SIMULATED_MS:
        raise BadHeader(
            name, line, f"{shown!r} is not a time; write whole milliseconds from 0 to {MAX_SIMULATED_MS} (ten minutes)"
        )
    return value_ms


def _headers(lines: list[str]) -> tuple[dict[str, tuple[int, str]], int]:
    """The header lines an answer opens with: name -> (line, raw value), and how many."""
    headers: dict[str, tuple[int, str]] = {}
    i = 0
    while i < len(lines):
        match = _HEADER.match(lines[i])
        if not match or match.group(1) in headers:
            break
        headers[match.group(1)] = (i, match.group(2))
        i += 1
    return headers, i


def parse_answer(text: str) -> StubAnswer:
    """Split an answer into its headers and turns. Raises `BadHeader` (a ValueError) on a
    header value that cannot be used."""
    lines = text.splitlines()
    raw, i = _headers(lines)
    values = {name: header_value(name, value, line) for name, (line, value) in raw.items() if value}
    turns: list[StubTurn] = []
    current: list[str] = []
    calls: list[StubCall] = []
    turn_cost, opening = 0.0, False  # `opening`: the line read is the first of a turn after `===`
    for n, line in enumerate(lines[i:] + ["==="], start=i):
        if _TURN_BREAK.match(line):
            turns.append(StubTurn(text="\n".join(current).strip(), calls=calls, cost=turn_cost))
            current, calls, turn_cost, opening = [], [], 0.0, True
            continue
        if opening and (own := _TURN_COST.match(line)):
            opening = False
            turn_cost = float(header_value("cost", own.group(1), n)) if own.group(1) else 0.0
            continue
        opening = False
        real = _TOOL.match(line)
        call = _CALL.match(line)
        if real:
            calls.append(StubCall(tool=real.group(1), input=real.group(2) or "{}", output="", real=True))
        elif call:
            calls.append(StubCall(tool=call.group(1), input=call.group(2) or "", output=call.group(3) or ""))
        else:
            current.append(line)
    return StubAnswer(
        turns=turns,
        cost=float(values.get("cost", 0.0)),
        ttft_ms=int(values.get("ttft_ms", 0)),
        delay_ms=int(values.get("delay_ms", 0)),
        fail=str(values["fail"]) if values.get("fail") else None,
    )


def header_problems(stub: str | list[str] | None) -> list[tuple[int | None, BadHeader]]:
    """Every header of an agent's `stub:` answers whose value cannot be used, as (the
    answer's index, or None for a single answer; the problem), for `laneflow check` and
    loading the agent. A value holding a placeholder (`{input.cost}`) is filled at run
    time, so it is checked only then."""
    answers = [(None, stub)] if isinstance(stub, str) else list(enumerate(stub or []))
    found: list[tuple[int | None, BadHeader]] = []
    for index, answer in answers:
        if not isinstance(answer, str):
            continue
        lines = answer.splitlines()
        headers = [(name, line, value) for name, (line, value) in _headers(lines)[0].items()]
        headers += [
            ("cost", n + 1, own.group(1))
            for n, line in enumerate(lines[:-1])
            if _TURN_BREAK.match(line) and (own := _TURN_COST.match(lines[n + 1]))
        ]
        for name, line, value in headers:
            if not value or _PLACEHOLDER.search(value):
                continue
            try:
                header_value(name, value, line)
            except BadHeader as bad:
                found.append((index, bad))
    return found


# -- the web tools' pretend results ------------------------------------------------------------

PRETEND_SEARCH_RESULTS = 2

MAX_FETCH_URL_CHARS = 250  # a longer URL the API's web fetch refuses (url_too_long)


@dataclass(frozen=True)
class PretendWeb:
    """What a stub `tool: web_search` / `tool: web_fetch` line is answered: the pages (title,
    URL) a search found or a fetch read, or the error code the API would answer."""

    pages: tuple[tuple[str, str], ...] = ()
    error: str | None = None


def _web_args(raw: str) -> dict[str, object] | None:
    try:
        args = jsonsafe.parse(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return None
    return args if isinstance(args, dict) else None


def pretend_web(tool: str, raw: str) -> PretendWeb:
    """The deterministic pretend result of a stub's web line: a search's pages name its query,
    a fetch's page its URL; input that is not what the tool takes is `invalid_tool_input`
    (and an over-long URL `url_too_long`), as the API says. Never raises."""
    args = _web_args(raw)
    if tool == "web_search":
        query = args.get("query") if args is not None else None
        if not isinstance(query, str) or not query.strip():
            return PretendWeb(error="invalid_tool_input")
        shown = query.strip()[:200]
        return PretendWeb(
            pages=tuple(
                (f"Pretend result {n} for {shown}", f"https://example.com/web-search/{n}?q={quote(shown, safe='')}")
                for n in range(1, PRETEND_SEARCH_RESULTS + 1)
            )
        )
    url = args.get("url") if args is not None else None
    if not isinstance(url, str) or not url.startswith(("https://", "http://")) or any(c.isspace() for c in url):
        return PretendWeb(error="invalid_tool_input")
    if len(url) > MAX_FETCH_URL_CHARS:
        return PretendWeb(error="url_too_long")
    return PretendWeb(pages=((f"Pretend page at {url}", url),))
