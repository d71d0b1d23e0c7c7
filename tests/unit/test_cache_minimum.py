"""The minimum cacheable prompt length: one source (the price catalog) for the engine's
decision to skip the warm gate and for the Messages API imitation."""

from __future__ import annotations

from laneflow.domain.gate import CHARS_PER_TOKEN, TOOL_USE_OVERHEAD_TOKENS, prefix_tokens
from laneflow.domain.pricing import catalog
from laneflow_dev.imitation import MessagesImitation


def test_the_catalog_knows_each_claude_model_s_minimum_and_matches_dated_ids() -> None:
    prices = catalog()
    assert prices.min_cacheable("claude-sonnet-4-6") == 2048
    assert prices.min_cacheable("claude-opus-4-6") == 4096
    assert prices.min_cacheable("claude-sonnet-4-5-20250929") == 1024
    assert prices.min_cacheable("claude-3-5-haiku-20241022") == 2048
    assert prices.min_cacheable("stub") is None and prices.min_cacheable("some-other-model") is None


def test_the_imitation_reads_its_minimums_from_the_catalog() -> None:
    server = MessagesImitation()
    for model, minimum in catalog().min_cacheable_by_model().items():
        assert server.min_cacheable_for(model) == minimum, model
        assert server.min_cacheable_for(model + "-20990101") == minimum, model


def test_the_prefix_estimate_counts_generously_and_tools_bring_their_overhead() -> None:
    assert prefix_tokens(3000, 0) == 3000 // CHARS_PER_TOKEN
    assert prefix_tokens(3001, 0) == 3000 // CHARS_PER_TOKEN + 1  # rounded up
    assert prefix_tokens(0, 900) == 900 // CHARS_PER_TOKEN + TOOL_USE_OVERHEAD_TOKENS
    # More than the imitation's characters / 4: a prefix it would cache is never taken for too short.
    assert all(prefix_tokens(n, 0) >= n // 4 for n in range(0, 20000, 97))
