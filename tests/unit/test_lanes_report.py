"""The cache rules read from records: lane rows and a step's cache_break (pure functions)."""

from __future__ import annotations

from typing import Any

from laneflow.domain.cache import min_cacheable, prefix_tokens, tokens_of
from laneflow.domain.estimate import LanePlan, cache_figures
from laneflow.domain.lanes_report import cache_break, earlier_writers, gate_wait_ms, lane_rows
from laneflow.domain.records import Event, EventType, ModelCall, PromptLayer, Step, StepStatus, Tokens

LAYERS = [
    PromptLayer(name="persona", chars=10, sha256="aaa"),
    PromptLayer(name="skills", chars=5, sha256="bbb"),
    PromptLayer(name="clock", chars=5, sha256="ccc", dynamic=True),
]


def wrote(
    index: int,
    *,
    model: str = "claude-sonnet-4-6",
    layers: list[PromptLayer] = LAYERS,
    tools: str = "t1",
    started: str = "2026-12-01T00:00:00.000Z",
) -> Step:
    return Step(
        index=index,
        group=0,
        agent="scout",
        model=model,
        status=StepStatus.completed,
        started_at=started,
        prompt_layers=list(layers),
        prefix={"tokens": 5000, "tools": tools},
        calls=[ModelCall(id=f"c{index}", tokens=Tokens(cache_write=5000))],
    )


def test_the_first_stable_layer_that_differs_is_named_with_the_step_it_differs_from() -> None:
    changed = [LAYERS[0], PromptLayer(name="skills", chars=6, sha256="zzz"), LAYERS[2]]
    assert cache_break(
        model="claude-sonnet-4-6", layers=changed, prefix={"tokens": 5000, "tools": "t1"}, earlier=[("run-1", wrote(3))]
    ) == {"layer": "skills", "since": "run-1/3"}


def layer_named(**kwargs: Any) -> str:
    """The layer a cache break names, asserting there is one."""
    found = cache_break(**kwargs)
    assert found is not None, f"no cache break found: {kwargs}"
    return found["layer"]


def test_a_dynamic_layer_never_breaks_the_cache_and_then_tools_model_minimum_or_expiry_is_named() -> None:
    dynamic_changed = [*LAYERS[:2], PromptLayer(name="clock", chars=5, sha256="new", dynamic=True)]
    base: dict[str, Any] = {"model": "claude-sonnet-4-6", "layers": dynamic_changed}
    assert layer_named(**base, prefix={"tokens": 5000, "tools": "t1"}, earlier=[("r", wrote(1))]) == "expired"
    assert layer_named(**base, prefix={"tokens": 5000, "tools": "t2"}, earlier=[("r", wrote(1))]) == "tools"
    assert layer_named(**base, prefix={"tokens": 100, "tools": "t1"}, earlier=[("r", wrote(1))]) == "below-minimum"
    assert cache_break(**base, prefix={"tokens": 5000}, earlier=[("r", wrote(1, model="claude-opus-4-6"))]) == {
        "layer": "model",
        "since": "r/1",
    }
    assert cache_break(**base, prefix=None, earlier=[]) is None


def test_this_runs_writers_come_before_the_previous_runs_and_a_later_start_is_not_earlier() -> None:
    me = Step(index=5, group=0, agent="scout", model="m", started_at="2026-12-01T00:00:05.000Z")
    mine = [wrote(1, started="2026-12-01T00:00:01.000Z"), wrote(2, started="2026-12-01T00:00:09.000Z"), me]
    assert [(r, s.index) for r, s in earlier_writers(me, ("run-now", mine), ("run-before", [wrote(7)]))] == [("run-now", 1)]
    assert [(r, s.index) for r, s in earlier_writers(me, ("run-now", [me]), ("run-before", [wrote(4), wrote(7)]))] == [
        ("run-before", 7),
        ("run-before", 4),
    ]


def test_siblings_that_started_in_the_same_millisecond_are_ordered_by_index_so_one_names_no_one() -> None:
    same = "2026-12-01T00:00:01.000Z"
    siblings = [wrote(i, started=same) for i in range(3)]
    earlier = {s.index: [e.index for _, e in earlier_writers(s, ("run-now", siblings), None)] for s in siblings}
    assert earlier == {0: [], 1: [0], 2: [1, 0]}


def test_lane_rows_count_cold_prefixes_cache_tokens_and_gate_waits_per_group_cycle_and_lane() -> None:
    lead = wrote(0)
    sibling = Step(
        index=1,
        group=0,
        agent="scout",
        model="claude-sonnet-4-6",
        started_at="2026-12-01T00:00:00.412Z",
        events=[
            Event(
                t="2026-12-01T00:00:00.000Z", type=EventType.gate, text="prompt cache: waiting for the first scout step's reply"
            )
        ],
        calls=[ModelCall(id="s", tokens=Tokens(cache_read=5000))],
    )
    other = Step(index=2, group=0, agent="scout", model="claude-sonnet-4-6", cycle=1)
    approval = Step(index=3, group=1, agent=None)
    assert gate_wait_ms(sibling) == 412
    assert lane_rows([lead, sibling, other, approval]) == [
        {
            "group": 0,
            "cycle": 0,
            "lane": "scout@claude-sonnet-4-6",
            "steps": 2,
            "cold_prefixes": 1,
            "cache_read": 5000,
            "cache_write": 5000,
            "gate_wait_ms": 412,
            "savings_usd": 0.0,
            # the sibling read the prefix the lead wrote: 5,000 tokens x ($3.75 - $0.30) / M
            "gate_savings_usd": 0.01725,
        },
        {
            "group": 0,
            "cycle": 1,
            "lane": "scout@claude-sonnet-4-6",
            "steps": 1,
            "cold_prefixes": 0,
            "cache_read": 0,
            "cache_write": 0,
            "gate_wait_ms": 0,
            "savings_usd": 0.0,
            "gate_savings_usd": 0.0,
        },
    ]


def test_the_estimates_cache_arithmetic_with_and_without_the_gate_and_below_the_minimum() -> None:
    plan = LanePlan(
        group=0,
        agent="scout",
        model="claude-sonnet-4-6",
        steps=6,
        parallel=3,
        prefix_tokens=4000,
        min_cacheable=2048,
        turns=2,
        input_tokens=100,
        output_tokens=50,
    )
    gated, ungated = cache_figures(plan, gate=True), cache_figures(plan, gate=False)
    assert (gated.cold_prefixes, gated.cache_write, gated.cache_read) == (1, 4000, (5 + 6) * 4000)
    assert (ungated.cold_prefixes, ungated.cache_write, ungated.cache_read) == (3, 12000, (3 + 6) * 4000)
    small = cache_figures(LanePlan(**{**plan.__dict__, "prefix_tokens": 1000}), gate=True)
    assert (small.cold_prefixes, small.cache_write, small.cache_read) == (0, 0, 0) and small.input == 6 * 100 + 6 * 50 + 12 * 1000
    assert min_cacheable("claude-sonnet-4-6-20260101") == 2048 and min_cacheable("stub") == 0
    assert prefix_tokens("x" * 9, [{"name": "a"}]) == tokens_of("x" * 9) + tokens_of('{"name":"a"}') == 3 + 3
