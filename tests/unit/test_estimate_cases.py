"""The estimate's cases (`domain.estimate`): what the low end, the point and the high end
assume a step does, what the registry's record makes a lead do, and what an ended run
teaches the next estimate."""

from __future__ import annotations

import itertools

import pytest

from laneflow.domain.estimate import (
    HIGH,
    LONG_REPLY_FACTOR,
    LOW,
    POINT,
    SHORT_REPLY_TOKENS,
    TOOL_RESULT_TOKENS,
    LaneFacts,
    StubAnswers,
    Usage,
    cache_figures,
    case_plans,
    case_usage,
    estimate_of,
    usage_of,
)
from laneflow.domain.prefixes import PrefixRecord, PrefixWriter
from laneflow.domain.pricing import catalog
from laneflow.domain.records import ModelCall, Step, Tokens

MODEL = "claude-sonnet-4-5"
NOW = 1_767_225_600.0


def _facts(**changes: object) -> LaneFacts:
    base: dict[str, object] = {
        "group": 0,
        "agent": "scout",
        "model": MODEL,
        "steps": 4,
        "parallel": 2,
        "prefix_tokens": 3000,
        "min_cacheable": 1024,
        "prefix_key": "k1",
        "inputs": (100, 100, 100, 100),
        "takes_handoff": (True, True, True, True),
        "max_turns": 6,
        "has_tools": True,
    }
    return LaneFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_low_is_one_short_turn_high_is_max_turns_of_long_replies_resending_the_conversation() -> None:
    facts = _facts()
    assert case_usage(LOW, facts, 400) == Usage(1, SHORT_REPLY_TOKENS, 0)
    assert case_usage(POINT, facts, 400) == Usage(1, 400, 400)
    high = case_usage(HIGH, facts, 400)
    assert (high.turns, high.output_tokens) == (6, LONG_REPLY_FACTOR * 400)
    assert high.later_input_tokens == (LONG_REPLY_FACTOR * 400 + TOOL_RESULT_TOKENS) * 6 // 2
    # An agent with no tools cannot take another turn: one, however long its reply.
    assert case_usage(HIGH, _facts(has_tools=False), 400).turns == 1
    # Learned: the point is what was measured, the high end at least that.
    learned = _facts(learned=Usage(turns=8, output_tokens=30, later_input_tokens=50, extra_usd=0.01))
    assert case_usage(POINT, learned, 400).turns == 8
    assert case_usage(HIGH, learned, 400).turns == 8 and case_usage(HIGH, learned, 400).extra_usd == 0.02


@pytest.mark.parametrize(
    ("steps", "parallel", "prefix", "has_tools", "learned"),
    list(itertools.product([1, 5], [1, 3], [500, 3000], [False, True], [None, Usage(3, 20, 60, 0.001)])),
)
def test_low_is_at_most_the_point_and_the_point_at_most_the_high(
    steps: int, parallel: int, prefix: int, has_tools: bool, learned: Usage | None
) -> None:
    facts = _facts(
        steps=steps,
        parallel=parallel,
        prefix_tokens=prefix,
        inputs=(80,) * steps,
        takes_handoff=(True,) * steps,
        has_tools=has_tools,
    )
    later = _facts(group=1, agent="writer", prefix_key="k2", steps=1, inputs=(40,), takes_handoff=(True,), has_tools=False)
    facts = LaneFacts(**{**facts.__dict__, "learned": learned})
    estimate = estimate_of("ws", "flow", [[facts], [later]], catalog(), output_tokens=400, now=NOW)
    assert 0 < estimate.low <= estimate.cost_with_gate <= estimate.high
    assert estimate.cost_with_gate <= estimate.cost_without_gate <= estimate.high


def test_a_warm_record_makes_the_lead_read_a_writer_now_only_with_the_gate_and_a_stale_one_nothing() -> None:
    warm = PrefixRecord(key="k1", model=MODEL, written_at=NOW - 60, warmed_by="run-a")
    writing = PrefixRecord(key="k1", model=MODEL, writer=PrefixWriter(run_id="run-b", index=0, n=1, claimed_at=NOW - 2))
    stale = PrefixRecord(key="k1", model=MODEL, written_at=NOW - 290, warmed_by="run-a")
    [w], [b], [s] = (case_plans([[_facts(registry=r)]], POINT, output_tokens=400, now=NOW) for r in (warm, writing, stale))
    assert w.lead_reads == "warm now (run run-a)" and cache_figures(w, gate=False).cold_prefixes == 0
    assert b.lead_reads == "being written now (run run-b)"
    assert cache_figures(b, gate=True).cold_prefixes == 0 and cache_figures(b, gate=False).cold_prefixes == 2
    assert s.lead_reads is None and cache_figures(s, gate=True).cache_write == 3000
    # The high end reads nothing from before the run; the stub's pretend cache is one run's.
    [h] = case_plans([[_facts(registry=warm)]], HIGH, output_tokens=400, now=NOW)
    on_stub = _facts(registry=warm, model="stub", min_cacheable=0, stub=StubAnswers(turns=1, output_tokens=10, cost_usd=0.0))
    [st] = case_plans([[on_stub]], POINT, output_tokens=400, now=NOW)
    assert h.lead_reads is None and st.lead_reads is None
    # A prefix below the minimum is never cached, warm record or not.
    [u] = case_plans([[_facts(registry=warm, prefix_tokens=900)]], POINT, output_tokens=400, now=NOW)
    assert u.lead_reads is None and cache_figures(u, gate=True).cache_read == 0


def _call(
    n: int, *, input: int, output: int, attempt: int | None = None, delegate: str | None = None, cost: float = 0.0
) -> ModelCall:
    return ModelCall(
        id=f"c{n}", n=n, model=MODEL, tokens=Tokens(input=input, output=output), attempt=attempt, delegate=delegate, cost_usd=cost
    )


def test_an_ended_runs_steps_teach_turns_output_growth_and_delegates_per_entry_from_their_last_attempt() -> None:
    steps = [
        Step(index=0, group=0, entry=0, agent="scout", model=MODEL, attempts=2, calls=[
            _call(1, input=999, output=999),  # the failed first attempt: not what a step does
            _call(2, input=20, output=10, attempt=2),
            _call(3, input=50, output=6, attempt=2),
            _call(4, input=5, output=5, attempt=2, delegate="helper", cost=0.004),
        ]),
        Step(index=1, group=0, entry=0, agent="scout", model=MODEL, attempts=1, calls=[
            _call(1, input=20, output=12),
            _call(2, input=40, output=8),
        ]),
        Step(index=2, group=1, entry=1, agent="scout", model=MODEL, attempts=1, calls=[_call(1, input=30, output=4)]),
    ]  # fmt: skip
    learned = usage_of(steps)
    assert learned[(0, "scout", MODEL)] == Usage(turns=2, output_tokens=9, later_input_tokens=25, extra_usd=0.002)
    assert learned[(1, "scout", MODEL)] == Usage(turns=1, output_tokens=4, later_input_tokens=0, extra_usd=0.0)
    assert learned[(None, "scout", MODEL)].turns == pytest.approx(5 / 3)
