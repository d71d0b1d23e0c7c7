"""The price catalog (prices.json beside this file): per model, USD per million tokens for
input, output, cache writes (5-minute and 1-hour) and cache reads, and the `effort` levels
the model takes (none: it takes no effort setting) with the beta header it needs them under,
if it takes them only in beta, and its minimum cacheable prompt length in tokens (a shorter
prefix is never cached). Spend counts cache writes and reads at their own prices."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from laneflow.domain.records import Tokens

CATALOG = Path(__file__).with_name("prices.json")


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float
    efforts: tuple[str, ...] = field(default=())  # the `output_config.effort` levels it takes
    effort_beta: str | None = None  # the beta header those need, where they are in beta
    min_cacheable: int | None = None  # tokens: a shorter prompt prefix is never cached

    def cost(self, tokens: Tokens, *, cache_ttl: str = "5m") -> float:
        write = self.cache_write_1h if cache_ttl == "1h" else self.cache_write_5m
        return (
            tokens.input * self.input
            + tokens.output * self.output
            + tokens.cache_write * write
            + tokens.cache_read * self.cache_read
        ) / 1_000_000


class PriceCatalog:
    def __init__(self, prices: dict[str, Price]):
        self._prices = prices

    @classmethod
    def load(cls, path: str | Path = CATALOG) -> PriceCatalog:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        prices = {}
        for name, fields in raw["models"].items():
            fields = dict(fields)
            fields["efforts"] = tuple(fields.get("efforts", ()))
            prices[name] = Price(**fields)
        return cls(prices)

    def price(self, model: str) -> Price | None:
        """The price of a model id; dated ids (claude-sonnet-4-5-20250929) match their
        family by the longest known prefix."""
        best = max((name for name in self._prices if model == name or model.startswith(name + "-")), key=len, default=None)
        return self._prices.get(best) if best else None

    def min_cacheable(self, model: str) -> int | None:
        """The model's minimum cacheable prompt length in tokens; None when not known."""
        price = self.price(model)
        return price.min_cacheable if price else None

    def min_cacheable_by_model(self) -> dict[str, int]:
        """Every known minimum cacheable length, by the model id prefix the catalog keys it on."""
        return {name: p.min_cacheable for name, p in self._prices.items() if p.min_cacheable is not None}


@lru_cache(maxsize=1)
def catalog() -> PriceCatalog:
    return PriceCatalog.load()
