"""The server tools' prices in the catalog: a web search at $10 per 1,000, whatever the
model, on top of the tokens; a web fetch at nothing beyond its tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laneflow.domain.pricing import CATALOG, PriceCatalog, catalog
from laneflow.domain.records import Tokens


def test_a_web_search_costs_a_hundredth_of_a_dollar_on_top_of_the_tokens() -> None:
    price = catalog().price("claude-sonnet-4-6-20260101")
    assert price is not None
    tokens = Tokens(input=1_000, output=500)
    assert price.cost(tokens, web_searches=3) == pytest.approx(price.cost(tokens) + 0.03)
    assert price.cost(tokens, web_fetches=7) == pytest.approx(price.cost(tokens))  # a fetch: its tokens only
    assert price.server_tools_cost(1_000) == pytest.approx(10.0)


def test_every_model_pays_the_same_for_a_search_and_the_stub_too() -> None:
    prices = json.loads(CATALOG.read_text())
    assert prices["server_tools"]["web_search"] == 10.0 and prices["server_tools"]["web_fetch"] == 0.0
    for model in prices["models"]:
        found = catalog().price(model)
        assert found is not None and found.server_tools_cost(2) == pytest.approx(0.02), model
    assert catalog().server_tools_cost(5, 5) == pytest.approx(0.05)


def test_a_catalog_without_server_tools_charges_nothing_for_them(tmp_path: Path) -> None:
    raw = json.loads(CATALOG.read_text())
    del raw["server_tools"]
    (tmp_path / "prices.json").write_text(json.dumps(raw))
    old = PriceCatalog.load(tmp_path / "prices.json")
    price = old.price("claude-sonnet-4-6")
    assert price is not None and price.cost(Tokens(), web_searches=10) == 0.0
    assert old.server_tools_cost(10) == 0.0
