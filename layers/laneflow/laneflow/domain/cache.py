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
import time
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


# The cache clock: what the prefix registry and the TTL choice measure time by. It is the
# wall clock, unless the setting LANEFLOW_CACHE_CLOCK says "RATE@EPOCH": then it runs RATE
# times as fast from EPOCH (epoch seconds), the same clock the Messages API imitation can be
# given, so a benchmark can space runs 15 minutes apart in 15 seconds.
CACHE_CLOCK = "LANEFLOW_CACHE_CLOCK"


def clock_of(spec: str | None) -> tuple[float, float]:
    """(rate, epoch) of a LANEFLOW_CACHE_CLOCK value; (1, 0) when unset. A value that is not
    "RATE@EPOCH" with a positive rate is a ValueError naming the variable."""
    if not spec:
        return 1.0, 0.0
    try:
        rate_text, epoch_text = spec.split("@", 1)
        rate, epoch = float(rate_text), float(epoch_text)
    except ValueError:
        raise ValueError(f"{CACHE_CLOCK}={spec!r}: expected RATE@EPOCH, for example 60@1767225600") from None
    if not (rate > 0 and math.isfinite(rate) and math.isfinite(epoch)):
        raise ValueError(f"{CACHE_CLOCK}={spec!r}: RATE must be a positive number")
    return rate, epoch


def cache_now(spec: str | None = None) -> float:
    """Now on the cache clock `spec` (a LANEFLOW_CACHE_CLOCK value; None: the wall clock), in epoch seconds."""
    rate, epoch = clock_of(spec)
    now = time.time()
    return now if rate == 1.0 else epoch + (now - epoch) * rate


def cache_iso(at: float) -> str:
    """A cache-clock time as the records write times (UTC, seconds)."""
    import datetime as _dt

    return _dt.datetime.fromtimestamp(at, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
