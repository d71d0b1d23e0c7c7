"""The stub executor's conventions (docs/INPUTS.md, "Stub answers")."""

from __future__ import annotations

import time

import pytest

from laneflow.adapters.executors.stub import StubExecutor, parse_answer, pick_answer
from laneflow.domain.errors import StepFailed
from laneflow.domain.records import ModelCall
from laneflow.ports import StepJob


class Sink:
    def __init__(self, stop_after: float | None = None):
        self.began_at: float | None = None
        self.calls: list[ModelCall] = []
        self.events: list[tuple[str, str, dict | None]] = []
        self.tools: list[tuple[str, str, str]] = []
        self._stop_at = time.monotonic() + stop_after if stop_after is not None else None

    def first_event(self) -> None:
        self.began_at = self.began_at or time.monotonic()

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:  # pragma: no cover - the stub has no minimum
        raise AssertionError("the stub keeps its gate")

    def call(self, span: ModelCall) -> ModelCall:
        self.calls.append(span)
        return span

    def event(self, type, text, data=None):
        self.events.append((type, text, data))

    def tool_call(self, name, tool_input, tool_output, *, ms=0, is_error=False):
        self.tools.append((name, tool_input, tool_output))

    def stopped(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at


def job(stub, k=0, item=None, run_input=None) -> StepJob:
    return StepJob(
        tenant="local", run_id="run-1", index=0, attempt=k + 1, agent="a", model="stub", item=item,
        run_input=run_input or {}, system_stable="S" * 400, system_dynamic="D" * 40, user="Do it.",
        stub=stub, answer_index=k,
    )


def test_kth_answer_of_a_step_position_and_the_last_repeats():
    answers = ["one", "two", "three"]
    assert [pick_answer(answers, k, "d") for k in range(5)] == ["one", "two", "three", "three", "three"]
    assert pick_answer("only", 7, "d") == "only"
    assert pick_answer(None, 0, "default") == "default"


def test_headers_in_any_order_then_the_reply():
    a = parse_answer("delay_ms: 800\ncost: 0.25\nttft_ms: 300\nThe reply.\nMore.")
    assert (a.cost, a.ttft_ms, a.delay_ms, a.fail) == (0.25, 300, 800, None)
    assert [t.text for t in a.turns] == ["The reply.\nMore."]


def test_a_header_like_line_after_the_reply_starts_is_reply_text():
    a = parse_answer("Hello\ncost: 3")
    assert a.cost == 0 and a.turns[0].text == "Hello\ncost: 3"


def test_call_lines_are_tool_calls_and_triple_equals_separates_turns():
    a = parse_answer("call: search tides => 3 results\nLooking.\n===\ncall: read a.md\n===\nFinal.")
    assert len(a.turns) == 3
    assert [(c.tool, c.input, c.output) for c in a.turns[0].calls] == [("search", "tides", "3 results")]
    assert a.turns[0].text == "Looking."
    assert a.turns[1].calls[0].tool == "read" and a.turns[1].calls[0].output == ""
    assert a.turns[2].text == "Final."


def test_every_turn_is_a_span_with_tokens_tools_and_stop_reason():
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


def test_simulated_time_to_first_token_and_latency_are_waited_and_recorded():
    sink = Sink()
    started = time.monotonic()
    StubExecutor().execute(job("ttft_ms: 120\ndelay_ms: 250\nok"), sink)
    elapsed = time.monotonic() - started
    assert sink.began_at is not None and sink.began_at - started >= 0.115
    assert elapsed >= 0.245
    assert sink.calls[0].ttft_ms == 120 and sink.calls[0].ms >= 245


def test_fail_header_fails_the_attempt_with_its_reason_before_any_reply():
    sink = Sink()
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(job(["fail: the model was overloaded", "fine"]), sink)
    assert err.value.reason == "the model was overloaded" and err.value.retryable
    assert sink.began_at is None and sink.calls == []
    # the next attempt at the same position gets the next answer
    assert StubExecutor().execute(job(["fail: x", "fine"], k=1), Sink()).conclusion == "fine"


def test_item_and_input_are_filled_into_the_answer():
    out = StubExecutor().execute(job("About {item} for {input.who}.", item="tides", run_input={"who": "kids"}), Sink())
    assert out.conclusion == "About tides for kids."


def test_a_stop_ends_a_slow_stub_turn():
    started = time.monotonic()
    with pytest.raises(StepFailed):
        StubExecutor(slice_s=0.01).execute(job("delay_ms: 5000\nslow"), Sink(stop_after=0.1))
    assert time.monotonic() - started < 1.0


def test_a_bad_header_value_is_a_clear_failure_not_a_crash():
    with pytest.raises(StepFailed) as err:
        StubExecutor().execute(job("cost: lots\nx"), Sink())
    assert "stub answer" in err.value.reason and not err.value.retryable



@pytest.mark.parametrize(("given", "said"), [
    ('{"command": "ls", "command": "rm -rf x"}', 'refused: $.command: the key "command" is given twice'),
    ('{"command": NaN}', "refused: $.command: NaN is not a number"),
    ("{nope", "is not JSON"),
])
def test_a_tool_line_whose_input_repeats_a_key_or_is_not_strict_json_is_the_calls_own_error(given, said):
    """A `tool:` line's input is JSON a person wrote: read strictly, and what is refused is
    the call's `is_error` result, before any tool runs."""
    from laneflow.adapters.executors.stub import _real_call
    from laneflow.adapters.executors.tools import ToolError
    from laneflow.domain.stub_answers import StubCall

    class NoTools:
        def run(self, name, args):
            raise AssertionError(f"{name} ran with {args}")

    with pytest.raises(ToolError) as refused:
        _real_call(StubCall(tool="bash", input=given, output="", real=True), NoTools())
    assert said in str(refused.value)
