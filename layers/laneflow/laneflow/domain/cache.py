"""Prompt-cache arithmetic shared by the stub model, the records and the estimate.

A prefix's size in tokens is counted the way the stub and the Messages API imitation count
it: ``ceil(chars / 4)`` per block (a tool definition is its canonical JSON, the stable system
block its text). The real API's tokenizer differs by a few per cent; the estimate says so.

The minimum cacheable prefix of a Claude model is the price catalog's (`prices.json`
`min_cacheable`): below it a request neither writes nor reads the cache. The stub has none.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

CHARS_PER_TOKEN = 4

CACHE_TTL_S = 300.0  # a 5-minute cache entry, refreshed by every read

SHA_PREFIX = 12

# A Claude model the catalog gives no minimum for is taken to cache from this many tokens.
FALLBACK_MIN_CACHEABLE = 1024


def tokens_in(chars: int) -> int:
    """Tokens of a block of `chars` characters (/ 4, rounded up)."""
    return math.ceil(chars / CHARS_PER_TOKEN)


def tokens_of(text: str) -> int:
    """Tokens of one block of text."""
    return tokens_in(len(text))


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prefix_tokens(system_stable: str, tool_definitions: Sequence[dict[str, Any]] = ()) -> int:
    """The cached prefix of a step's request: its tools, then its stable system block."""
    return sum(tokens_of(canonical(d)) for d in tool_definitions) + (tokens_of(system_stable) if system_stable else 0)


def tools_digest(names: Iterable[str]) -> str:
    """A short digest of the tools a step is given (in the stable order they are sent)."""
    return hashlib.sha256("\n".join(sorted(names)).encode("utf-8")).hexdigest()[:SHA_PREFIX]


def min_cacheable(model: str) -> int:
    """The fewest prefix tokens the model caches: the price catalog's `min_cacheable` (0 for
    the stub: it always caches)."""
    if model == "stub":
        return 0
    from laneflow.domain.pricing import catalog  # the catalog reads the records' token counts

    known = catalog().min_cacheable(model)
    return known if known is not None else FALLBACK_MIN_CACHEABLE
