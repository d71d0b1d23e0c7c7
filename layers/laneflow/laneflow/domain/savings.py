"""What the prompt cache saved, in dollars at the price catalog's prices (prices.json).

- A step's `savings_usd` (`calls_savings_usd`): what its calls' cache reads saved against
  paying those tokens as plain input, less what their cache writes cost beyond plain input
  (a 5-minute write at `cache_write_5m`, a 1-hour one at `cache_write_1h`). A step that only
  writes saves less than nothing: on Sonnet 4.6 a 5,000-token 5-minute write is -$0.00375.
- A lane's `gate_savings_usd` (`lane_gate_savings_usd`): what the warm gate saved against
  every step of the lane writing its own prefix.

The stub, and a model the catalog does not price, save $0. Figures are rounded to the
micro-dollar, as the stores keep costs.
"""

from __future__ import annotations

from collections.abc import Iterable

from laneflow.domain.pricing import Price, PriceCatalog, catalog
from laneflow.domain.records import ModelCall, Step

PER_MILLION = 1_000_000


def _price(prices: PriceCatalog, call_model: str, model: str) -> Price | None:
    """A call's price: its own model's (a delegate's turn may run on another), else the step's."""
    return prices.price(call_model) or prices.price(model)


def call_savings(price: Price, call: ModelCall) -> float:
    """One call's saving, unrounded: its reads at (input - read) less its writes at
    (write - input), each write at its TTL's price."""
    tokens = call.tokens
    hour, five = price.cache_writes(tokens)
    saved = tokens.cache_read * (price.input - price.cache_read)
    extra = five * (price.cache_write_5m - price.input) + hour * (price.cache_write_1h - price.input)
    return (saved - extra) / PER_MILLION


def calls_savings_usd(calls: Iterable[ModelCall], model: str, prices: PriceCatalog | None = None) -> float:
    """What these calls' cache reads saved against paying them as plain input, less what
    their cache writes cost beyond plain input, at the catalog's prices (each call at its
    own model's price, else `model`'s; 0.0 for the stub or a model without a price)."""
    prices = prices or catalog()
    total = 0.0
    for call in calls:
        price = _price(prices, call.model, model)
        if price is not None:
            total += call_savings(price, call)
    return round(total, 6)


def lane_gate_savings_usd(steps: list[Step], prices: PriceCatalog | None = None) -> float:
    """What the warm gate saved one lane (its steps: one agent on one model, one group and
    cycle) against every step of the lane writing its own prefix.

    The rule: without the gate, every step of a lane started together writes the prefix its
    first model call sends. So each step whose first call (the lowest `n`) read the cache
    (`cache_read > 0`) would have written those tokens instead: it saved
    `cache_read x (write price - read price) / 1,000,000`, the write price at the TTL the
    step asked for (`cache_ttl` "1h": `cache_write_1h`, else `cache_write_5m`). A step whose
    first call wrote the prefix (the lead), an approval (no agent), a step with no call and
    later calls (which read what their own step wrote) count nothing. A lead that read a
    prefix another run wrote counts too (the baseline is every step writing its own, and
    across runs the gate waits for a writer in flight). The stub, and a model without a
    price, save $0."""
    prices = prices or catalog()
    total = 0.0
    for step in steps:
        if step.agent is None or not step.calls:
            continue
        first = min(step.calls, key=lambda c: c.n)
        read = first.tokens.cache_read
        price = _price(prices, first.model, step.model)
        if read <= 0 or price is None:
            continue
        write = price.cache_write_1h if step.cache_ttl == "1h" else price.cache_write_5m
        total += read * (write - price.cache_read) / PER_MILLION
    return round(total, 6)
