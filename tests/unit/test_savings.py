"""What the prompt cache saved, in dollars: a step's calls, a lane's warm gate, a 1-hour
write's price, the lane rows and the run's outline. Every figure is worked out here by hand
from the prices in prices.json, read by the test (not from the code under test)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from laneflow.domain.lanes_report import lane_rows
from laneflow.domain.outline import StepFacts, outline_of, saved
from laneflow.domain.pricing import CATALOG, catalog
from laneflow.domain.records import ModelCall, Step, StepStatus, Tokens
from laneflow.domain.savings import calls_savings_usd, lane_gate_savings_usd

SONNET = "claude-sonnet-4-6"
HAIKU = "claude-haiku-4-5"


def listed(model: str) -> dict[str, Any]:
    """The model's prices as prices.json lists them (USD per million tokens)."""
    prices: dict[str, Any] = json.loads(CATALOG.read_text(encoding="utf-8"))["models"][model]
    return prices


def call(n: int = 1, model: str = SONNET, **tokens: int) -> ModelCall:
    return ModelCall(id=f"c{n}", n=n, model=model, tokens=Tokens(**tokens))


def test_reads_save_the_input_price_less_the_read_price_per_token() -> None:
    p = listed(SONNET)
    expected = 5000 * (p["input"] - p["cache_read"]) / 1_000_000  # 5,000 x $2.70/M = $0.0135
    assert calls_savings_usd([call(cache_read=5000, input=40, output=300)], SONNET) == pytest.approx(expected, abs=1e-9)
    assert expected > 0


def test_a_write_only_step_saves_less_than_nothing_at_its_ttls_price() -> None:
    p = listed(SONNET)
    five = calls_savings_usd([call(cache_write=5000)], SONNET)
    hour = calls_savings_usd([call(cache_write=5000, cache_write_1h=5000)], SONNET)
    assert five == pytest.approx(-5000 * (p["cache_write_5m"] - p["input"]) / 1_000_000, abs=1e-9)
    assert hour == pytest.approx(-5000 * (p["cache_write_1h"] - p["input"]) / 1_000_000, abs=1e-9)
    assert hour < five < 0  # a 1-hour write costs more beyond plain input than a 5-minute one


def test_a_write_split_by_ttl_and_reads_over_several_calls_and_models_are_summed_and_rounded() -> None:
    s, h = listed(SONNET), listed(HAIKU)
    calls = [
        call(1, cache_write=3000, cache_write_1h=1000),  # 2,000 at 5 minutes, 1,000 at an hour
        call(2, cache_read=3000),
        call(3, model=HAIKU, cache_read=777),  # a delegate's turn on its own model, at its price
    ]
    expected = (
        -2000 * (s["cache_write_5m"] - s["input"])
        - 1000 * (s["cache_write_1h"] - s["input"])
        + 3000 * (s["input"] - s["cache_read"])
        + 777 * (h["input"] - h["cache_read"])
    ) / 1_000_000
    got = calls_savings_usd(calls, SONNET)
    assert got == round(expected, 6) and got != 0
    assert calls_savings_usd([], SONNET) == 0.0


def test_the_stub_and_a_model_without_a_price_save_nothing() -> None:
    assert calls_savings_usd([call(model="stub", cache_read=5000, cache_write=9000)], "stub") == 0.0
    assert calls_savings_usd([call(model="gpt-unknown", cache_read=5000)], "gpt-unknown") == 0.0
    assert lane_gate_savings_usd([lane_step(1, [call(model="stub", cache_read=5000)], model="stub")]) == 0.0


def test_a_one_hour_write_is_priced_at_the_one_hour_price_and_the_rest_at_five_minutes() -> None:
    p = listed(SONNET)
    price = catalog().price(SONNET)
    assert price is not None
    tokens = Tokens(input=10, output=20, cache_read=30, cache_write=4000, cache_write_1h=1000)
    by_hand = (
        10 * p["input"] + 20 * p["output"] + 30 * p["cache_read"] + 3000 * p["cache_write_5m"] + 1000 * p["cache_write_1h"]
    ) / 1_000_000
    assert price.cost(tokens) == pytest.approx(by_hand, rel=1e-12)
    # Without the split every write is a 5-minute one, as before; the TTL asked for prices all at an hour.
    assert price.cost(Tokens(cache_write=4000)) == pytest.approx(4000 * p["cache_write_5m"] / 1_000_000, rel=1e-12)
    assert price.cost(Tokens(cache_write=4000), cache_ttl="1h") == pytest.approx(4000 * p["cache_write_1h"] / 1_000_000)


def test_tokens_read_from_an_older_record_have_no_one_hour_part() -> None:
    old = ModelCall.model_validate_json('{"id": "x", "tokens": {"input": 1, "cache_write": 5}}')
    assert old.tokens.cache_write_1h == 0 and old.tokens.cache_write == 5
    assert '"cache_write_1h":2' in call(cache_write=5, cache_write_1h=2).model_dump_json()


def lane_step(index: int, calls: list[ModelCall], *, model: str = SONNET, ttl: str | None = None, saved: float = 0.0) -> Step:
    return Step(
        index=index,
        group=0,
        agent="scout",
        model=model,
        status=StepStatus.completed,
        calls=calls,
        cache_ttl=ttl,
        savings_usd=saved,
    )


def test_the_gate_saved_each_step_whose_first_call_read_the_prefix_a_write_of_it() -> None:
    p = listed(SONNET)
    lead = lane_step(0, [call(1, cache_write=5000), call(2, cache_read=5000)])  # its second call reads its own
    siblings = [lane_step(i, [call(1, cache_read=5000), call(2, cache_read=5200)]) for i in (1, 2, 3)]
    hourly = lane_step(4, [call(1, cache_read=5000)], ttl="1h")
    cold = lane_step(5, [call(1, cache_write=5000)])  # it wrote its own (the gate did not help it)
    got = lane_gate_savings_usd([lead, *siblings, hourly, cold])
    expected = (3 * 5000 * (p["cache_write_5m"] - p["cache_read"]) + 5000 * (p["cache_write_1h"] - p["cache_read"])) / 1_000_000
    assert got == round(expected, 6) and got > 0
    assert lane_gate_savings_usd([lead, cold]) == 0.0  # nothing read on a first call: nothing saved
    # The first call is the lowest n, whatever order the spans come in.
    assert lane_gate_savings_usd([lane_step(6, [call(2, cache_read=5000), call(1, cache_write=5000)])]) == 0.0


def test_lane_rows_carry_their_steps_savings_and_the_gates() -> None:
    p = listed(SONNET)
    lead = lane_step(0, [call(1, cache_write=5000)], saved=-0.00375)
    sibling = lane_step(1, [call(1, cache_read=5000)], saved=0.0135)
    other = lane_step(2, [call(1, model=HAIKU, cache_read=100)], model=HAIKU, saved=0.00009)
    approval = Step(index=3, group=1, agent=None)
    rows = {r["lane"]: r for r in lane_rows([lead, sibling, other, approval])}
    assert set(rows) == {f"scout@{SONNET}", f"scout@{HAIKU}"}
    sonnet = rows[f"scout@{SONNET}"]
    assert sonnet["savings_usd"] == round(-0.00375 + 0.0135, 6)
    assert sonnet["gate_savings_usd"] == round(5000 * (p["cache_write_5m"] - p["cache_read"]) / 1_000_000, 6)
    h = listed(HAIKU)
    assert rows[f"scout@{HAIKU}"]["gate_savings_usd"] == round(100 * (h["cache_write_5m"] - h["cache_read"]) / 1_000_000, 6)
    assert rows[f"scout@{HAIKU}"]["savings_usd"] == 0.00009


def test_the_runs_savings_are_its_steps_summed_across_groups_rescues_included() -> None:
    def facts(index: int, group: int, savings: float, rescue: bool = False) -> StepFacts:
        return StepFacts(
            index=index,
            group=group,
            cycle=0,
            status="completed",
            rescue=rescue,
            optional=False,
            cost_usd=0.1,
            savings_usd=savings,
        )

    outline = outline_of([facts(0, 0, 0.0135), facts(1, 0, -0.00375), facts(2, 1, 0.002), facts(3, 1, 0.001, rescue=True)])
    assert [o.savings_usd for o in outline] == [round(0.0135 - 0.00375, 6), 0.003]
    assert saved(outline) == round(0.0135 - 0.00375 + 0.003, 6)
