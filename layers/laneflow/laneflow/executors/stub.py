"""The stub executor: no model, answers from the agent's `stub:` (DESIGN section 8).

An answer may open with header lines, in any order::

    cost: 0.25        a pretend price for the attempt (budgets are testable)
    ttft_ms: 300      simulated time to first token (per turn)
    delay_ms: 800     simulated total latency (per turn)
    fail: REASON      the attempt fails with that reason (after ttft_ms, before any reply)

A price is a number of USD from 0 to MAX_COST_USD, a time whole milliseconds from 0 to
MAX_SIMULATED_MS (ten minutes); anything else fails the attempt (not retried) naming the
agent.md and the answer, and `laneflow check` reports it with its line.

The rest is the reply. In it, `call: TOOL INPUT => OUTPUT` lines are pretend tool calls,
recorded exactly as real ones, and a `===` line separates earlier turns from the final one.
Every turn is recorded as a model-call span (model `stub`, its simulated times, tokens
estimated from text lengths), so a stub run's record has the shape of a real one.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field

from ..errors import StepFailed, StepStopped
from ..fill import fill
from ..models import ModelCall, Tokens, utcnow
from .base import ExecutionSink, StepJob, StepOutcome

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
_TURN_BREAK = re.compile(r"^\s*===\s*$")


@dataclass
class StubCall:
    tool: str
    input: str
    output: str


@dataclass
class StubTurn:
    text: str
    calls: list[StubCall] = field(default_factory=list)


@dataclass
class StubAnswer:
    turns: list[StubTurn]
    cost: float = 0.0
    ttft_ms: int = 0
    delay_ms: int = 0
    fail: str | None = None


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
            raise BadHeader(name, line, f"{shown!r} is not a price; write a number of USD from 0 to {MAX_COST_USD:,}, such as 0.25")
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
    for line in lines[i:] + ["==="]:
        if _TURN_BREAK.match(line):
            turns.append(StubTurn(text="\n".join(current).strip(), calls=calls))
            current, calls = [], []
            continue
        call = _CALL.match(line)
        if call:
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
        for name, (line, value) in _headers(answer.splitlines())[0].items():
            if not value or _PLACEHOLDER.search(value):
                continue
            try:
                header_value(name, value, line)
            except BadHeader as bad:
                found.append((index, bad))
    return found


def _answer_source(job: StepJob) -> str:
    """Where the answer a job was given is written: its agent's agent.md and field (a
    judge's answers are AGENTS.md's `judge.stub`)."""
    if isinstance(job.stub, list) and job.stub:
        field = f"stub[{min(job.answer_index, len(job.stub) - 1)}]"
    else:
        field = "stub"
    if not job.agent_path:
        return f"AGENTS.md ({'judge.' + field})"
    return f"{job.agent_path}/agent.md ({field})"


def _estimate_tokens(chars: int) -> int:
    return max(1, (chars + 3) // 4) if chars else 0


class StubExecutor:
    """Answers from `stub:`; sleeps its simulated times in small slices so a stop is seen."""

    name = "stub"

    def __init__(self, slice_s: float = 0.05):
        self._slice = slice_s

    def _wait(self, ms: int, sink: ExecutionSink) -> None:
        deadline = time.monotonic() + ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            if sink.stopped():
                raise StepStopped()
            time.sleep(min(self._slice, left))

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        default = f"Done: {job.user.splitlines()[0] if job.user else job.agent}"
        raw = pick_answer(job.stub, job.answer_index, default)
        raw = fill(raw, item=job.item, run_input=job.run_input, has_item=job.item is not None)
        try:
            answer = parse_answer(raw)
        except BadHeader as exc:
            raise StepFailed(f"the stub answer in {_answer_source(job)} is not valid: {exc}", retryable=False) from None

        if answer.fail:
            self._wait(answer.ttft_ms, sink)
            raise StepFailed(answer.fail, retryable=True)

        prompt_chars = len(job.system_stable) + len(job.system_dynamic) + len(job.user)
        texts: list[str] = []
        for number, turn in enumerate(answer.turns, start=1):
            started = time.monotonic()
            at = utcnow()
            self._wait(answer.ttft_ms, sink)
            if number == 1:
                sink.first_event()
            self._wait(max(0, answer.delay_ms - answer.ttft_ms), sink)
            for call in turn.calls:
                sink.tool_call(call.tool, call.input, call.output)
            last = number == len(answer.turns)
            out_chars = len(turn.text) + sum(len(c.tool) + len(c.input) for c in turn.calls)
            over_budget = last and job.budget is not None and answer.cost > job.budget
            sink.call(
                ModelCall(
                    id=f"stub-{uuid.uuid4().hex[:12]}",
                    at=at,
                    ms=int((time.monotonic() - started) * 1000),
                    ttft_ms=answer.ttft_ms,
                    model="stub",
                    tokens=Tokens(input=_estimate_tokens(prompt_chars), output=_estimate_tokens(out_chars)),
                    tools=len(turn.calls),
                    stop="tool_use" if turn.calls and not last else "end_turn",
                    cost_usd=answer.cost if last else 0.0,
                )
            )
            if over_budget:
                raise StepFailed(
                    f"stopped at its budget: this attempt cost ${answer.cost:.4f}, ${job.budget:.4f} was left", retryable=False
                )
            # What the model saw grows with each turn: its own text and the tool results.
            prompt_chars += out_chars + sum(len(c.output) for c in turn.calls)
            if turn.text:
                texts.append(turn.text)
        conclusion = answer.turns[-1].text if answer.turns else ""
        return StepOutcome(
            result="\n\n".join(texts), conclusion=conclusion, cost_usd=answer.cost, turns=len(answer.turns)
        )
