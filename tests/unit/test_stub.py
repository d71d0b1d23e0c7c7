"""The stub executor's conventions (docs/INPUTS.md, "Stub answers")."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.executors.stub import StubExecutor
from laneflow.domain.errors import StepFailed, StepStopped
from laneflow.domain.records import EventType, ModelCall
from laneflow.domain.stub_answers import BadHeader, header_problems, parse_answer, pick_answer
from laneflow.ports import StepInbox, StepJob


class Sink:
    inbox: StepInbox | None = None  # the stub has no colleagues

    def __init__(self, stop_after: float | None = None) -> None:
        self.began_at: float | None = None
        self.calls: list[ModelCall] = []
        self.events: list[tuple[str, str, dict[str, Any] | None]] = []
        self.tools: list[tuple[str, str, str]] = []
        self._stop_at = time.monotonic() + stop_after if stop_after is not None else None

    def first_event(self) -> None:
        self.began_at = self.began_at or time.monotonic()

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:  # pragma: no cover - the stub has no minimum
        raise AssertionError("the stub keeps its gate")

    def call(self, span: ModelCall) -> ModelCall:
        self.calls.append(span)
        return span

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((type, text, data))

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        self.tools.append((name, tool_input, tool_output))

    def stopped(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at

    turns_allowed: int | None = None  # how many turns the run's budget lets begin (None: all)
    turns_begun = 0

    def begin_turn(self) -> None:
        if self.turns_allowed is not None and self.turns_begun >= self.turns_allowed:
            raise StepFailed("budget spent: refused", retryable=False)
        self.turns_begun += 1


def job(stub: str | list[str] | None, k: int = 0, item: Any = None, run_input: Any = None) -> StepJob:
    return StepJob(
        tenant="local",
        run_id="run-1",
        index=0,
        attempt=k + 1,
        agent="a",
        model="stub",
        item=item,
        run_input=run_input or {},
        system_stable="S" * 400,
        system_dynamic="D" * 40,
        user="Do it.",
        stub=stub,
        answer_index=k,
    )


def test_kth_answer_of_a_step_position_and_the_last_repeats() -> None:
    answers = ["one", "two", "three"]
    assert [pick_answer(answers, k, "d") for k in range(5)] == ["one", "two", "three", "three", "three"]
    assert pick_answer("only", 7, "d") == "only"
    assert pick_answer(None, 0, "default") == "default"


def test_headers_in_any_order_then_the_reply() -> None:
    a = parse_answer("delay_ms: 800\ncost: 0.25\nttft_ms: 300\nThe reply.\nMore.")
    assert (a.cost, a.ttft_ms, a.delay_ms, a.fail) == (0.25, 300, 800, None)
    assert [t.text for t in a.turns] == ["The reply.\nMore."]


def test_a_header_like_line_after_the_reply_starts_is_reply_text() -> None:
    a = parse_answer("Hello\ncost: 3")
    assert a.cost == 0 and a.turns[0].text == "Hello\ncost: 3"


def test_call_lines_are_tool_calls_and_triple_equals_separates_turns() -> None:
    a = parse_answer("call: search tides => 3 results\nLooking.\n===\ncall: read a.md\n===\nFinal.")
    assert len(a.turns) == 3
    assert [(c.tool, c.input, c.output) for c in a.turns[0].calls] == [("search", "tides", "3 results")]
    assert a.turns[0].text == "Looking."
    assert a.turns[1].calls[0].tool == "read" and a.turns[1].calls[0].output == ""
    assert a.turns[2].text == "Final."


def test_every_turn_is_a_span_with_tokens_tools_and_stop_reason() -> None:
    sink = Sink()
    out = StubExecutor().execute(job("cost: 0.5\ncall: search x => y\nThinking\n===\nDone."), sink)
    assert [c.stop for c in sink.calls] == ["tool_use", "end_turn"]
    assert [c.tools for c in sink.calls] == [1, 0]
    seen = [c.tokens.input + c.tokens.cache_read + c.tokens.cache_write for c in sink.calls]
    assert all(c.model == "stub" and c.tokens.output > 0 for c in sink.calls) and all(n > 100 for n in seen)
    assert sink.calls[1].tokens.input > sink.calls[0].tokens.input  # the second turn saw the first
    # The pretend cache: the first turn writes the prefix, the second reads it.
    assert sink.calls[0].tokens.cache_write > 0 and sink.calls[0].tokens.cache_read == 0
    assert sink.calls[1].tokens.cache_read == sink.calls[0].tokens.cache_write and sink.calls[1].tokens.cache_write == 0
    assert sum(c.cost_usd for c in sink.calls) == pytest.approx(0.5)
    assert sink.tools == [("search", "x", "y")]
    assert out.conclusion == "Done." and out.result == "Thinking\n\nDone." and out.cost_usd == 0.5


def test_simulated_time_to_first_token_and_latency_are_waited_and_recorded() -> None:
    # The stub's clock is one the test reads: it moves only when the stub sleeps, so what it
    # waited is exact (no machine's speed in it)
    class Clock:
        now, slept = 1000.0, 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds
            self.slept += seconds

    clock, sink = Clock(), Sink()
    first_event_after: list[float] = []
    sink.first_event = lambda: first_event_after.append(clock.slept)  # type: ignore[method-assign]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("laneflow.adapters.executors.stub.time", clock)
        StubExecutor().execute(job("ttft_ms: 120\ndelay_ms: 250\nok"), sink)
    # The first token came after the time to first token, the reply after the whole latency
    assert first_event_after == [pytest.approx(0.120)]
    assert clock.slept == pytest.approx(0.250)
    assert sink.calls[0].ttft_ms == 120 and sink.calls[0].ms == 250


def test_fail_header_fails_the_attempt_with_its_reason_before_any_reply() -> None:
    sink = Sink()
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(job(["fail: the model was overloaded", "fine"]), sink)
    assert err.value.reason == "the model was overloaded" and err.value.retryable
    assert sink.began_at is None and sink.calls == []
    # the next attempt at the same position gets the next answer
    assert StubExecutor().execute(job(["fail: x", "fine"], k=1), Sink()).conclusion == "fine"


def test_item_and_input_are_filled_into_the_answer() -> None:
    out = StubExecutor().execute(job("About {item} for {input.who}.", item="tides", run_input={"who": "kids"}), Sink())
    assert out.conclusion == "About tides for kids."


def test_a_stop_ends_a_slow_stub_turn() -> None:
    sink = Sink(stop_after=0.1)
    # The stop, not the 5 s turn's end: the turn raised stopped and never answered
    with pytest.raises(StepStopped):
        StubExecutor(slice_s=0.01).execute(job("delay_ms: 5000\nslow"), sink)
    assert sink.calls == []


def test_a_bad_header_value_is_a_clear_failure_not_a_crash() -> None:
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(job("cost: lots\nx"), Sink())
    assert "stub answer" in err.value.reason and not err.value.retryable


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ('{"command": "ls", "command": "rm -rf x"}', 'refused: $.command: the key "command" is given twice'),
        ('{"command": NaN}', "refused: $.command: NaN is not a number"),
        ("{nope", "is not JSON"),
    ],
)
def test_a_tool_line_whose_input_repeats_a_key_or_is_not_strict_json_is_the_calls_own_error(given: str, said: str) -> None:
    """A `tool:` line's input is JSON a person wrote: read strictly, and what is refused is
    the call's `is_error` result, before any tool runs."""
    from laneflow.adapters.executors.stub import _real_call
    from laneflow.adapters.executors.tools import ToolError
    from laneflow.domain.stub_answers import StubCall

    class NoTools:
        def run(self, name: str, args: Any) -> None:
            raise AssertionError(f"{name} ran with {args}")

    with pytest.raises(ToolError) as refused:
        _real_call(StubCall(tool="bash", input=given, output="", real=True), NoTools())  # type: ignore[arg-type]  # a partial fake
    assert said in str(refused.value)


# -- each turn's own cost, and the run's budget before each turn -------------------------------


def test_a_turn_may_open_with_its_own_cost_charged_on_that_turn_and_the_answer_cost_on_the_last() -> None:
    a = parse_answer("cost: 0.01\nLooking.\n===\ncost: 0.03\ncall: search x => y\nStill looking.\n===\ncost: 0.02\nDone.")
    assert [t.cost for t in a.turns] == [0.0, 0.03, 0.02] and a.cost == 0.01 and a.total_cost == 0.06
    assert [t.text for t in a.turns] == ["Looking.", "Still looking.", "Done."]
    sink = Sink()
    out = StubExecutor().execute(job("cost: 0.01\nLooking.\n===\ncost: 0.03\nStill.\n===\ncost: 0.02\nDone."), sink)
    assert [c.cost_usd for c in sink.calls] == [0.0, 0.03, 0.03] and out.cost_usd == 0.06


def test_a_cost_line_inside_a_turn_is_reply_text_and_a_bad_turn_cost_is_reported_with_its_line() -> None:
    a = parse_answer("One.\n===\nTwo.\ncost: 0.5")
    assert [t.cost for t in a.turns] == [0.0, 0.0] and a.turns[1].text == "Two.\ncost: 0.5"
    with pytest.raises(BadHeader) as err:
        parse_answer("One.\n===\ncost: lots\nTwo.")
    assert err.value.line == 2
    [(index, bad)] = header_problems(["fine", "One.\n===\ncost: -1\nTwo."])
    assert index == 1 and bad.line == 2 and bad.header == "cost"


def test_the_sink_is_asked_before_every_turn_and_a_refused_turn_ends_the_attempt_with_no_more_turns() -> None:
    answer = "Turn one.\n===\ncost: 0.03\nTurn two.\n===\ncost: 0.03\nTurn three.\n===\ncost: 0.03\nFinal."
    sink = Sink()
    StubExecutor().execute(job(answer), sink)
    assert sink.turns_begun == 4
    refused = Sink()
    refused.turns_allowed = 2
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(job(answer), refused)
    assert err.value.reason.startswith("budget spent") and not err.value.retryable
    assert len(refused.calls) == 2 and [c.cost_usd for c in refused.calls] == [0.0, 0.03]
    failing = Sink()
    failing.turns_allowed = 0
    with pytest.raises(StepFailed, match="budget spent"):  # a `fail:` answer's one turn is refused too
        StubExecutor().execute(job("fail: overloaded"), failing)


def test_an_agent_budget_stops_the_attempt_at_the_turn_that_passes_it() -> None:
    limited = dataclasses.replace(job("One.\n===\ncost: 0.2\nTwo.\n===\ncost: 0.2\nThree.\n===\nFour."), budget=0.3)
    sink = Sink()
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(limited, sink)
    assert err.value.reason.startswith("stopped at its budget: this attempt cost $0.4000") and not err.value.retryable
    assert [c.cost_usd for c in sink.calls] == [0.0, 0.2, 0.2]  # the fourth turn never ran


_COSTS = st.lists(st.one_of(st.none(), st.decimals(min_value=0, max_value=100, places=4)), min_size=1, max_size=6)


@given(_COSTS, st.one_of(st.none(), st.decimals(min_value=0, max_value=100, places=4)))
def test_an_answer_costs_its_own_cost_and_every_turns_and_each_turn_keeps_its_text(costs: Any, header: Any) -> None:
    turns = [(f"cost: {c}\n" if c is not None and n else "") + f"Turn {n}." for n, c in enumerate(costs)]
    text = (f"cost: {header}\n" if header is not None else "") + "\n===\n".join(turns)
    a = parse_answer(text)
    assert [t.text for t in a.turns] == [f"Turn {n}." for n in range(len(costs))]
    own = [float(c) if c is not None and n else 0.0 for n, c in enumerate(costs)]
    assert [t.cost for t in a.turns] == own
    assert a.total_cost == pytest.approx(float(header or 0) + sum(own))
