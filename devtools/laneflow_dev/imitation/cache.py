"""The imitation's prompt cache, with the semantics that make laneflow's warm gate matter: an
entry is created when a request arrives, but it becomes readable only once the response that
wrote it has begun (`begin`). A request reads the longest readable, unexpired breakpoint
prefix and writes an entry at every eligible breakpoint longer than what it read (`plan`).
Times are the cache clock's (`CacheClock`: the wall clock, or a fast one)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from laneflow.domain.cache import CACHE_CLOCK, clock_of
from laneflow_dev.imitation.prompt import Prompt

SWEEP_EVERY = 256  # requests between two sweeps of the expired entries


class CacheClock:
    """What the cache's entries are timed by, in epoch seconds: the wall clock, or one running
    `rate` times as fast from `epoch` (epoch seconds), the clock laneflow's prefix registry
    reads from LANEFLOW_CACHE_CLOCK="RATE@EPOCH" (laneflow.domain.cache.cache_now): given the
    same spec, both say the same "now", so a benchmark can space runs 15 minutes apart in
    1.5 s at rate 600. Only the cache's times run fast; the prefill and the output's pace
    are slept in real time."""

    def __init__(self, rate: float = 1.0, epoch: float = 0.0):
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"clock_rate must be a positive number, not {rate!r}")
        if not math.isfinite(epoch):
            raise ValueError(f"clock_epoch must be a finite number, not {epoch!r}")
        self.rate, self.epoch = float(rate), float(epoch)

    @classmethod
    def of(cls, rate: float | None, epoch: float | None) -> CacheClock:
        """The clock given (a missing part: rate 1, epoch 0); neither given: the environment's
        LANEFLOW_CACHE_CLOCK, if set (a bad value is a ValueError naming it)."""
        if rate is None and epoch is None:
            return cls(*clock_of(os.environ.get(CACHE_CLOCK)))
        return cls(1.0 if rate is None else rate, 0.0 if epoch is None else epoch)

    def now(self) -> float:
        wall = time.time()
        return wall if self.rate == 1.0 else self.epoch + (wall - self.epoch) * self.rate


@dataclass
class Entry:
    tokens: int
    ttl_s: float
    expires_at: float
    readable_at: float | None = None  # set when a writing response begins


@dataclass
class Plan:
    """What one request does to the cache (decided on arrival)."""

    read_tokens: int = 0
    write_tokens: int = 0
    write_5m: int = 0
    write_1h: int = 0
    written: list[Entry] = field(default_factory=list)

    def begin(self, now: float) -> None:
        """The response begins: what it wrote becomes readable."""
        for entry in self.written:
            if entry.readable_at is None:
                entry.readable_at = now


class PromptCache:
    """The entries by breakpoint key. Not locked: its owner holds its lock around each use."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._since_sweep = 0

    def clear(self) -> None:
        self.entries.clear()

    def plan(self, prompt: Prompt, minimum: int, ttl_of: Callable[[str], float], now: float) -> Plan:
        """Read the longest readable prefix; write every longer breakpoint (billed once).
        `minimum`: the model's minimum cacheable tokens; `ttl_of`: a breakpoint's ttl ("5m",
        "1h") in seconds."""
        plan = Plan()
        eligible = [bp for bp in prompt.breakpoints if bp.tokens >= minimum]
        self._since_sweep += 1
        if self._since_sweep >= SWEEP_EVERY:
            self._since_sweep = 0
            for key in [k for k, e in self.entries.items() if e.expires_at <= now]:
                del self.entries[key]
        for bp in reversed(eligible):
            entry = self.entries.get(bp.key)
            if entry is None:
                continue
            if entry.expires_at <= now:
                del self.entries[bp.key]
                continue
            if entry.readable_at is not None and entry.readable_at <= now:
                entry.ttl_s = max(entry.ttl_s, ttl_of(bp.ttl))
                entry.expires_at = now + entry.ttl_s
                plan.read_tokens = bp.tokens
                break
        covered = plan.read_tokens
        for bp in eligible:
            if bp.tokens <= covered:
                continue
            ttl_s = ttl_of(bp.ttl)
            entry = self.entries.get(bp.key)
            if entry is None or entry.expires_at <= now:
                entry = Entry(tokens=bp.tokens, ttl_s=ttl_s, expires_at=now + ttl_s)
                self.entries[bp.key] = entry
            else:  # pending: another response is writing it too; this one pays again
                entry.ttl_s = max(entry.ttl_s, ttl_s)
                entry.expires_at = now + entry.ttl_s
            plan.written.append(entry)
            segment = bp.tokens - covered
            if bp.ttl == "1h":
                plan.write_1h += segment
            else:
                plan.write_5m += segment
            covered = bp.tokens
        plan.write_tokens = covered - plan.read_tokens
        return plan
