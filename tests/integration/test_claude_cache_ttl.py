"""The Claude executor's cache TTL, through the real anthropic SDK against the local Messages
API imitation: a job asking for the 1-hour TTL sends `ttl: "1h"` on its stable block (a
5-minute one sends no ttl), its span counts the 1-hour write apart and is priced at the
1-hour price, and what it saved is worked out at that price."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.domain.pricing import CATALOG
from laneflow.domain.records import EventType, ModelCall
from laneflow.domain.savings import calls_savings_usd
from laneflow.ports import StepInbox, StepJob
from laneflow_dev.imitation import MessagesImitation, Reply

KEY = "sk-test-0123456789abcdef"
MODEL = "claude-sonnet-4-6"
STABLE = "You are a careful analyst. " * 1000  # ~6,750 tokens: above the model's 2,048 minimum


class Recorded:
    """An ExecutionSink that keeps the spans (by id, as a store would) and the trace."""

    inbox: StepInbox | None = None

    def __init__(self) -> None:
        self.spans: dict[str, ModelCall] = {}
        self.events: list[tuple[str, str]] = []

    def first_event(self) -> None:
        return None

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:
        raise AssertionError(f"the prefix ({tokens} tokens) should be cacheable (minimum {minimum})")

    def begin_turn(self) -> None:
        return None

    def call(self, span: ModelCall) -> ModelCall:
        self.spans[span.id] = span
        return span

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((str(type), text))

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        raise AssertionError("no tools here")

    def stopped(self) -> bool:
        return False


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(api_keys={KEY}) as server:
        yield server


def job(ttl: str, index: int = 0) -> StepJob:
    return StepJob(
        tenant="local",
        run_id="run-ttl",
        index=index,
        attempt=1,
        agent="analyst",
        model=MODEL,
        item=None,
        run_input=None,
        system_stable=STABLE,
        system_dynamic="Today is a test.",
        user="Summarise the brief.",
        cache_ttl=ttl,
    )


def run(api: MessagesImitation, ttl: str, index: int = 0) -> ModelCall:
    """One attempt of a job with this TTL; its one span."""
    sink = Recorded()
    outcome = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01).execute(job(ttl, index), sink)
    assert outcome.turns == 1 and not [e for e in sink.events if e[0] == "warning"], sink.events
    [span] = sink.spans.values()
    return span


def listed() -> dict[str, float]:
    import json

    prices: dict[str, float] = json.loads(CATALOG.read_text(encoding="utf-8"))["models"][MODEL]
    return prices


def test_a_one_hour_job_sends_ttl_1h_and_its_span_counts_and_prices_the_hour_write(api: MessagesImitation) -> None:
    seen: list[dict[str, Any]] = []
    original = api.responder

    def spy(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return original(body)

    api.responder = spy
    span = run(api, "1h")

    assert seen[0]["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert "cache_control" not in seen[0]["system"][1]  # the dynamic block stays uncached
    tokens = span.tokens
    assert tokens.cache_write > 2048 and tokens.cache_write_1h == tokens.cache_write and tokens.cache_read == 0
    assert api.stats()["cache_write_1h_tokens"] == tokens.cache_write and api.stats()["cache_write_5m_tokens"] == 0
    p = listed()
    by_hand = (tokens.input * p["input"] + tokens.output * p["output"] + tokens.cache_write * p["cache_write_1h"]) / 1_000_000
    assert span.cost_usd == pytest.approx(by_hand, rel=1e-6)
    at_five = (tokens.input * p["input"] + tokens.output * p["output"] + tokens.cache_write * p["cache_write_5m"]) / 1_000_000
    assert span.cost_usd > at_five  # not the 5-minute price
    # What the step saved: nothing read, its hour write beyond plain input.
    assert calls_savings_usd([span], MODEL) == round(-tokens.cache_write * (p["cache_write_1h"] - p["input"]) / 1_000_000, 6)

    # The next step of the agent reads the hour's entry, and saves what the read spared.
    again = run(api, "1h", index=1)
    assert again.tokens.cache_read == tokens.cache_write and again.tokens.cache_write == 0
    assert calls_savings_usd([again], MODEL) == round(again.tokens.cache_read * (p["input"] - p["cache_read"]) / 1_000_000, 6)


def test_a_five_minute_job_sends_no_ttl_and_its_write_is_priced_at_five_minutes(api: MessagesImitation) -> None:
    seen: list[dict[str, Any]] = []
    original = api.responder

    def spy(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return original(body)

    api.responder = spy
    span = run(api, "5m")

    assert seen[0]["system"][0]["cache_control"] == {"type": "ephemeral"}
    tokens = span.tokens
    assert tokens.cache_write > 2048 and tokens.cache_write_1h == 0
    assert api.stats()["cache_write_5m_tokens"] == tokens.cache_write and api.stats()["cache_write_1h_tokens"] == 0
    p = listed()
    by_hand = (tokens.input * p["input"] + tokens.output * p["output"] + tokens.cache_write * p["cache_write_5m"]) / 1_000_000
    assert span.cost_usd == pytest.approx(by_hand, rel=1e-6)
