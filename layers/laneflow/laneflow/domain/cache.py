"""Prompt-cache arithmetic shared by the stub model, the records and the estimate.

A prefix's size in tokens is counted the way the stub and the Messages API imitation count
it: ``ceil(chars / 4)`` per block (a tool definition is its canonical JSON, the stable system
block its text). The real API's tokenizer differs by a few per cent; the estimate says so.

The minimum cacheable prefix per Claude model (Anthropic's prompt-caching documentation):
below it a request neither writes nor reads the cache. The stub has no minimum.
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

# Longest-prefix match on the model id (dated ids match their family); "*" for other Claude models.
MIN_CACHEABLE: dict[str, int] = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048,
    "claude-sonnet-4-5": 1024,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "*": 1024,
}



def tokens_of(text: str) -> int:
    """Tokens of one block of text (its characters / 4, rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)



def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)



def prefix_tokens(system_stable: str, tool_definitions: Sequence[dict[str, Any]] = ()) -> int:
    """The cached prefix of a step's request: its tools, then its stable system block."""
    return sum(tokens_of(canonical(d)) for d in tool_definitions) + (tokens_of(system_stable) if system_stable else 0)



def tools_digest(names: Iterable[str]) -> str:
    """A short digest of the tools a step is given (in the stable order they are sent)."""
    return hashlib.sha256("\n".join(sorted(names)).encode("utf-8")).hexdigest()[:SHA_PREFIX]



def min_cacheable(model: str) -> int:
    """The fewest prefix tokens the model caches (0 for the stub: it always caches)."""
    if model == "stub":
        return 0
    best = max((name for name in MIN_CACHEABLE if name != "*" and model.startswith(name)), key=len, default=None)
    return MIN_CACHEABLE[best] if best else MIN_CACHEABLE["*"]
