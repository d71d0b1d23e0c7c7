"""The price catalog (prices.json beside this file): per model, USD per million tokens for
input, output, cache writes (5-minute and 1-hour) and cache reads, and the `effort` levels
the model takes (none: it takes no effort setting) with the beta header it needs them under,
if it takes them only in beta, and its minimum cacheable prompt length in tokens (a shorter
prefix is never cached). Spend counts cache writes and reads at their own prices: a usage's
1-hour writes (`Tokens.cache_write_1h`) at the 1-hour price, its other writes at the 5-minute.

Anthropic's server tools are priced per request, the same for every model (the catalog's
`server_tools`, USD per 1,000 requests): a web search at $10 per 1,000 (`usage.server_tool_use
.web_search_requests`), a web fetch at nothing beyond the tokens its content adds."""

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
    web_search: float = 0.0  # USD per 1,000 web searches (the catalog's `server_tools`)
    web_fetch: float = 0.0  # USD per 1,000 web fetches

    def cost(self, tokens: Tokens, *, cache_ttl: str = "5m", web_searches: int = 0, web_fetches: int = 0) -> float:
        """What the tokens cost: a cache write's 1-hour part (`cache_write_1h`) at the 1-hour
        price, the rest at the 5-minute one; `cache_ttl="1h"` prices every write at the 1-hour
        price (an estimate that knows only the TTL asked for, not the usage's split)."""
        hour, five = self.cache_writes(tokens, cache_ttl)
        return (
            tokens.input * self.input
            + tokens.output * self.output
            + five * self.cache_write_5m
            + hour * self.cache_write_1h
            + tokens.cache_read * self.cache_read
        ) / 1_000_000 + self.server_tools_cost(web_searches, web_fetches)

    @staticmethod
    def cache_writes(tokens: Tokens, cache_ttl: str = "5m") -> tuple[int, int]:
        """(1-hour, 5-minute) written tokens of a usage: its `cache_write_1h` part (all of
        `cache_write` when `cache_ttl` is "1h"), and the rest."""
        hour = tokens.cache_write if cache_ttl == "1h" else min(max(tokens.cache_write_1h, 0), tokens.cache_write)
        return hour, tokens.cache_write - hour

    def server_tools_cost(self, web_searches: int, web_fetches: int = 0) -> float:
        """What the server tools' requests cost beyond the tokens."""
        return (web_searches * self.web_search + web_fetches * self.web_fetch) / 1_000


class PriceCatalog:
    def __init__(self, prices: dict[str, Price], server_tools: dict[str, float] | None = None):
        self._prices = prices
        self._server = server_tools or {}  # USD per 1,000 requests, by server tool

    @classmethod
    def load(cls, path: str | Path = CATALOG) -> PriceCatalog:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        prices = {}
        server = raw.get("server_tools", {})
        for name, fields in raw["models"].items():
            fields = {"web_search": server.get("web_search", 0.0), "web_fetch": server.get("web_fetch", 0.0), **fields}
            fields["efforts"] = tuple(fields.get("efforts", ()))
            prices[name] = Price(**fields)
        return cls(prices, {k: float(v) for k, v in server.items() if k in ("web_search", "web_fetch")})

    def price(self, model: str) -> Price | None:
        """The price of a model id; dated ids (claude-sonnet-4-5-20250929) match their
        family by the longest known prefix."""
        best = max((name for name in self._prices if model == name or model.startswith(name + "-")), key=len, default=None)
        return self._prices.get(best) if best else None

    def server_tools_cost(self, web_searches: int, web_fetches: int = 0) -> float:
        """What server-tool requests cost beyond tokens, whatever the model (the stub's too)."""
        return (web_searches * self._server.get("web_search", 0.0) + web_fetches * self._server.get("web_fetch", 0.0)) / 1_000

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
