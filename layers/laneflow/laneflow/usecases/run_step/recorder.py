"""The recorder: the `ExecutionSink` of one attempt, every write fenced by the attempt's
identity; spans written with the attempt's end, heartbeats, stop checks and the run's budget
before each model turn as it runs."""

from __future__ import annotations

import secrets as _secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from laneflow.domain.errors import StepFailed
from laneflow.domain.records import (
    AttemptRef,
    Event,
    EventType,
    ModelCall,
    Step,
    utcnow,
)
from laneflow.domain.redaction import STEP_CAPTURE_LIMIT, Redactor
from laneflow.domain.settlement import turn_refused
from laneflow.ports import Delegator, Services, StepInbox, Store

HEARTBEAT_S = 60.0

# How stale the run record an attempt watches may be: a stop, and the run's spend its budget
# is checked against before each model turn, are read at most this often (one item read).
WATCH_S = 0.5

FLUSH_S = 30.0


CAPTURE_FULL = "capture limit of"  # how the trace line that says so begins


def captured(step: Step) -> int:
    """Characters the step's earlier attempts captured (the limit is the step's, not an attempt's)."""
    return sum(
        int(e.data.get("input_chars", 0)) + int(e.data.get("output_chars", 0))
        for e in step.events
        if e.type == EventType.tool and e.data and "capture" in e.data
    )


def capture_full(step: Step) -> bool:
    """An earlier attempt of the step reached the capture limit (nothing more is captured)."""
    return any(e.type == EventType.warning and e.text.startswith(CAPTURE_FULL) for e in step.events)


# -- the sink ----------------------------------------------------------------------------------


@dataclass
class StepRecorder:
    """The `ExecutionSink` of one attempt: every write fenced by the attempt's identity."""

    svc: Services
    ref: AttemptRef
    base_n: int
    redact: Redactor
    capture: bool = True
    on_first_event: Any = None
    # Called once, with no argument, when the attempt's first call reports a cache write.
    on_cache_write: Any = None
    on_uncacheable: Any = None  # (tokens, minimum): a lead's prefix cannot be cached
    # Called once with the attempt's first call once it reports a cache read or write.
    on_first_call: Any = None
    run_budget: float | None = None  # the run's `budget:` (USD), checked before each model turn
    cost_usd: float = 0.0
    began: bool = False
    _numbers: dict[str, int] = field(default_factory=dict)
    _costs: dict[str, float] = field(default_factory=dict)
    _captured: int = 0  # characters this attempt has captured
    _capture_full: bool = False  # the limit was reached: nothing more is captured
    _stop_checked: float = 0.0
    _stopped: bool = False
    _run_cost: float | None = None  # the run's cost as last read (what its ended attempts spent)
    _cost_read: float = 0.0
    _turns: int = 0  # model turns begun by this attempt
    _beat: float = field(default_factory=time.monotonic)
    _flushed: float = field(default_factory=time.monotonic)
    spans: dict[str, ModelCall] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    inbox: StepInbox | None = None  # the step's colleagues and inbox (peers, ask), when its agent has them
    delegator: Delegator | None = None  # runs its delegates, when its agent has `delegates:`
    step_budget: float | None = None  # what is left of the step's `budget:` for this attempt, its delegates' turns included

    @property
    def runs(self) -> Store:
        """What the step's `history` tool reads the workspace's earlier runs from: the store,
        through its port (masked as it was written)."""
        return self.svc.store

    def first_event(self) -> None:
        with self._lock:
            if self.began:
                return
            self.began = True
        self.svc.crashpoints.reached("mid-model-call")
        if self.on_first_event:
            self.on_first_event()

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:
        if self.on_uncacheable:
            self.on_uncacheable(tokens, minimum)

    def call(self, span: ModelCall) -> ModelCall:
        """Spans are kept here and written with the attempt's end (one write); a long attempt
        writes them as it goes, at most every FLUSH_S, so a running step shows its turns."""
        with self._lock:
            n = self._numbers.setdefault(span.id, self.base_n + len(self._numbers) + 1)
            self.cost_usd += span.cost_usd - self._costs.get(span.id, 0.0)
            self._costs[span.id] = span.cost_usd
            span = span.model_copy(update={"n": n, "attempt": self.ref.n if self.ref.n > 1 else None})
            self.spans[span.id] = span
            due = time.monotonic() - self._flushed > FLUSH_S
            if due:
                self._flushed = time.monotonic()
            wrote = n == self.base_n + 1 and span.tokens.cache_write > 0 and self.on_cache_write is not None
            if wrote:
                on_write, self.on_cache_write = self.on_cache_write, None
            cached = span.tokens.cache_read > 0 or span.tokens.cache_write > 0
            first = n == self.base_n + 1 and cached and self.on_first_call is not None
            if first:
                on_first, self.on_first_call = self.on_first_call, None
        if wrote:
            on_write()
        if first:
            on_first(span)
        if due:
            self.svc.store.put_call(self.ref, span)
        return span

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        # Masked by the store, like every write.
        self.svc.store.add_event(
            self.ref.tenant, self.ref.run_id, self.ref.index, Event(type=type, text=text, data=data), attempt=self.ref
        )

    def tool_call(
        self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False, delegate: str | None = None
    ) -> None:
        """A tool event and, while the step captures, the call's input and output (`delegate`:
        the delegate that made the call, if not the step's own agent).

        With `capture: metadata` no input or output text is kept anywhere (the event holds
        the tool's name, the sizes and the time). With `full`, calls are captured until the
        step's captures would pass STEP_CAPTURE_LIMIT characters; from that call on none is
        (however small), and their events too keep names, sizes and times only."""
        # Masked first, so the sizes recorded are those of what the capture keeps.
        tool_input, tool_output = self.redact(tool_input), self.redact(tool_output)
        data: dict[str, Any] = {"tool": name, "input_chars": len(tool_input), "output_chars": len(tool_output), "ms": ms}
        if is_error:
            data["is_error"] = True
        if delegate:
            data["delegate"] = delegate
        size = len(tool_input) + len(tool_output)
        with self._lock:
            if self.capture and not self._capture_full and self._captured + size > STEP_CAPTURE_LIMIT:
                self._capture_full = True
                full_now = True
            else:
                full_now = False
            keep = self.capture and not self._capture_full
            if keep:
                self._captured += size
        if full_now:
            self.event(
                EventType.warning,
                f"{CAPTURE_FULL} {STEP_CAPTURE_LIMIT:,} characters reached: this and later tool calls keep names, sizes and times only",
                {"captured_chars": self._captured},
            )
        if keep:
            key = f"s{self.ref.index}-a{self.ref.n}-{_secrets.token_hex(4)}"
            data["capture"] = self.svc.captures.put(
                self.ref.tenant, self.ref.run_id, key, {"tool": name, "input": tool_input, "output": tool_output, "at": utcnow()}
            )
            shown = tool_input if len(tool_input) <= 200 else tool_input[:200] + "…"
            self.event(EventType.tool, f"{f'[{delegate}] ' if delegate else ''}{name} {shown}".strip(), data)
        else:
            self.event(EventType.tool, f"[{delegate}] {name}" if delegate else name, data)

    def stopped(self) -> bool:
        if self.svc.leaving.is_set():
            return True  # this worker is going away: end the call now (the attempt is interrupted, not stopped)
        now = time.monotonic()
        if not self._stopped and now - self._stop_checked > WATCH_S:
            self._watch(now)
            if now - self._beat > HEARTBEAT_S:
                self._beat = now
                self.svc.store.heartbeat(self.ref, utcnow())  # AttemptEnded: someone ended it
        return self._stopped

    def begin_turn(self) -> None:
        """The run's budget holds inside a group: once the run's spend reaches it, no model
        turn begins (`StepFailed`, not retried, "budget spent ..."). The spend is the run's
        cost as stored, to which every attempt adds what it spent as it ends, read at most
        WATCH_S before (the read that also watches for a stop), plus what this attempt has
        spent so far. So another step's attempt still running counts once it ends: the run
        can pass its budget by the turns under way when it was reached (and by those begun
        within WATCH_S of it), never by a step or a turn begun later."""
        self._turns += 1
        if self.step_budget is not None and self.cost_usd > self.step_budget:
            raise StepFailed(
                f"stopped at its budget: this attempt cost ${self.cost_usd:.4f}, ${self.step_budget:.4f} was left",
                retryable=False,
            )
        if self.run_budget is None:
            return
        now = time.monotonic()
        if self._run_cost is None or now - self._cost_read > WATCH_S:
            self._watch(now)
        spent = round((self._run_cost or 0.0) + self.cost_usd, 6)
        if spent >= self.run_budget:
            raise StepFailed(turn_refused(spent, self.run_budget, self._turns), retryable=False)

    def _watch(self, now: float) -> None:
        """Read the run once: whether it was stopped, and what it has spent."""
        run = self.svc.store.get_run(self.ref.tenant, self.ref.run_id, steps=False, input=False)
        self._stop_checked = self._cost_read = now
        self._stopped = self._stopped or run.stop_requested
        self._run_cost = run.cost_usd
