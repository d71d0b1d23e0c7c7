"""The stub executor: no model, answers from the agent's `stub:` (docs/INPUTS.md, "Stub answers").

An answer may open with header lines, in any order::

    cost: 0.25        a pretend price for the attempt (budgets are testable), charged on its final turn
    ttft_ms: 300      simulated time to first token (per turn)
    delay_ms: 800     simulated total latency (per turn)
    fail: REASON      the attempt fails with that reason (after ttft_ms, before any reply)

A price is a number of USD from 0 to MAX_COST_USD, a time whole milliseconds from 0 to
MAX_SIMULATED_MS (ten minutes); anything else fails the attempt (not retried) naming the
agent.md and the answer, and `laneflow check` reports it with its line.

The rest is the reply. In it, `call: TOOL INPUT => OUTPUT` lines are pretend tool calls,
recorded exactly as real ones; `tool: NAME {JSON}` lines make a REAL call of one of the
step's tools (through the same `StepTools` the Claude executor uses: bash and scripts run in
the sandbox, `peers_message` sends a real message), recorded exactly like a model's call, a
tool's own failure included (a `tool: web_search` or `tool: web_fetch` line of a granted web
tool gets a pretend result, recorded as the API's use is and its searches priced from the
catalog: adapters/executors/web.py); and a `===` line separates earlier turns from the final one; a turn may open with a `cost:` line of its own
(charged on that turn, so a step's spend grows turn by turn). Before each turn the sink is
asked whether the run's budget lets one begin (`begin_turn`).
Colleagues' messages (and answers) not yet given are delivered before each turn.
Every turn is recorded as a model-call span (model `stub`, its simulated times, tokens
estimated from text lengths), so a stub run's record has the shape of a real one.

Its prompt cache is pretend but keeps the real rules, so the warm gate and the records'
cache figures can be tested without a model: the prefix is the step's tools and stable
system prompt (`domain.cache.prefix_tokens`); a turn reads it (`cache_read`) once a reply
that wrote it has begun, else writes it (`cache_write`) and it becomes readable at that
turn's first event. The entries are this process's and one run's: a stub run starts cold
(its figures do not depend on what ran before it), and its `input` tokens are the rest.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid

from laneflow.adapters.executors.isolation import Isolation
from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain import jsonsafe
from laneflow.domain.cache import CACHE_TTL_S, prefix_tokens, tokens_in
from laneflow.domain.errors import StepFailed, StepStopped
from laneflow.domain.placeholders import fill
from laneflow.domain.records import ModelCall, Tokens, utcnow
from laneflow.domain.stub_answers import BadHeader, StubCall, parse_answer, pick_answer
from laneflow.ports import ExecutionSink, StepJob, StepOutcome


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


def _real_call(call: StubCall, tools: StepTools) -> str:
    """A `tool:` line run for real: its output, or its own failure's message (ToolError)."""
    try:  # strictly, as any JSON a person writes: a key given twice is refused, not the last one taken
        args = jsonsafe.parse(call.input) if call.input.strip() else {}
    except jsonsafe.Refusal as refused:
        raise ToolError(f"the input of this {call.tool} call is refused: {refused}") from None
    except ValueError:
        raise ToolError(f"the input of this {call.tool} call is not JSON; write tool: NAME {{...}}") from None
    return tools.run(call.tool, args)


class PretendCache:
    """The stub's prompt cache: prefix key -> (readable, expires at), under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[bool, float]] = {}

    def request(self, key: str) -> bool:
        """A request carrying the prefix arrives: True if it reads it, False if it writes it."""
        now = time.monotonic()
        with self._lock:
            readable, expires = self._entries.get(key, (False, 0.0))
            if expires > now and readable:
                self._entries[key] = (True, now + CACHE_TTL_S)
                return True
            if expires <= now:
                self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
                self._entries[key] = (False, now + CACHE_TTL_S)
            return False

    def begun(self, key: str) -> None:
        """The reply that wrote the prefix has begun: from now on it is read."""
        with self._lock:
            self._entries[key] = (True, time.monotonic() + CACHE_TTL_S)


PRETEND_CACHE = PretendCache()


def _cache_key(job: StepJob, definitions: list[dict[str, object]]) -> str:
    text = json.dumps([job.run_id, job.model, job.system_stable, [d.get("name") for d in definitions]])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class StubExecutor:
    """Answers from `stub:`; sleeps its simulated times in small slices so a stop is seen."""

    name = "stub"

    def __init__(self, slice_s: float = 0.05, *, isolation: Isolation | None = None):
        self._slice = slice_s
        self.isolation = isolation  # None: the strongest the machine offers

    def _wait(self, ms: int, sink: ExecutionSink) -> None:
        deadline = time.monotonic() + ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            if sink.stopped():
                raise StepStopped()
            time.sleep(min(self._slice, left))

    @staticmethod
    def _call(call: StubCall, tools: StepTools, sink: ExecutionSink) -> str:
        """Record one tool call of a turn (a real one run first) and return its output."""
        if not call.real:
            sink.tool_call(call.tool, call.input, call.output)
            return call.output
        if call.tool in tools.web.names:  # a server tool: the API would run it, the stub pretends
            return tools.web.pretend(call.tool, call.input, sink)
        started = time.monotonic()
        try:
            output, failed = _real_call(call, tools), False
        except ToolError as exc:  # the tool's own failure: recorded, and the turn goes on
            output, failed = str(exc), True
        sink.tool_call(call.tool, call.input, output, ms=int((time.monotonic() - started) * 1000), is_error=failed)
        return output

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        tools = StepTools(job, sink, isolation=self.isolation)
        try:
            return self._attempt(job, sink, tools)
        finally:
            tools.close()  # its MCP servers end with the attempt

    def _attempt(self, job: StepJob, sink: ExecutionSink, tools: StepTools) -> StepOutcome:
        default = f"Done: {job.user.splitlines()[0] if job.user else job.agent}"
        raw = pick_answer(job.stub, job.answer_index, default)
        raw = fill(raw, item=job.item, run_input=job.run_input, has_item=job.item is not None)
        try:
            answer = parse_answer(raw)
        except BadHeader as exc:
            raise StepFailed(f"the stub answer in {_answer_source(job)} is not valid: {exc}", retryable=False) from None

        tools.prepare()  # before any turn: the isolation named, network_enforce honoured
        if answer.fail:
            sink.begin_turn()  # its one turn fails; refused before it like any other once the budget is spent
            self._wait(answer.ttft_ms, sink)
            raise StepFailed(answer.fail, retryable=True)

        definitions = tools.definitions()
        prefix, key = prefix_tokens(job.system_stable, definitions), _cache_key(job, definitions)
        prompt_chars = len(job.system_dynamic) + len(job.user)  # beyond the cached prefix
        texts: list[str] = []
        spent = 0.0  # what this attempt has cost so far
        web_spent = 0.0  # of it, the pretend web searches' price
        for number, turn in enumerate(answer.turns, start=1):
            # Colleagues' messages and answers not yet given join this turn (between `===` turns).
            prompt_chars += sum(len(text) for text in tools.colleagues.pending())
            sink.begin_turn()  # the run's budget: no turn begins once it is spent
            started = time.monotonic()
            at = utcnow()
            read = PRETEND_CACHE.request(key)
            self._wait(answer.ttft_ms, sink)
            if not read:
                PRETEND_CACHE.begun(key)
            if number == 1:
                sink.first_event()
            self._wait(max(0, answer.delay_ms - answer.ttft_ms), sink)
            outputs = [self._call(call, tools, sink) for call in turn.calls]
            web_cost = tools.web.end_request(sink) if tools.web.names else 0.0
            web_spent += web_cost
            last = number == len(answer.turns)
            out_chars = len(turn.text) + sum(len(c.tool) + len(c.input) for c in turn.calls)
            cost = round(turn.cost + (answer.cost if last else 0.0) + web_cost, 6)
            spent = round(spent + cost, 6)
            over_budget = cost > 0 and job.budget is not None and spent > job.budget
            sink.call(
                ModelCall(
                    id=f"stub-{uuid.uuid4().hex[:12]}",
                    at=at,
                    ms=int((time.monotonic() - started) * 1000),
                    ttft_ms=answer.ttft_ms,
                    model="stub",
                    tokens=Tokens(
                        input=tokens_in(prompt_chars),
                        output=tokens_in(out_chars),
                        cache_read=prefix if read else 0,
                        cache_write=0 if read else prefix,
                    ),
                    tools=len(turn.calls),
                    stop="tool_use" if turn.calls and not last else "end_turn",
                    cost_usd=cost,
                )
            )
            if over_budget:
                raise StepFailed(
                    f"stopped at its budget: this attempt cost ${spent:.4f}, ${job.budget:.4f} was left", retryable=False
                )
            # What the model saw grows with each turn: its own text and the tool results.
            prompt_chars += out_chars + sum(len(o) for o in outputs)
            if turn.text:
                texts.append(turn.text)
        conclusion = answer.turns[-1].text if answer.turns else ""
        return StepOutcome(
            result="\n\n".join(texts),
            conclusion=conclusion,
            cost_usd=round(answer.total_cost + web_spent, 6),
            turns=len(answer.turns),
        )
