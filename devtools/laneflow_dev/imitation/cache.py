"""The imitation's prompt cache, with the semantics that make laneflow's warm gate matter: an
entry is created when a request arrives, but it becomes readable only once the response that
wrote it has begun (`begin`). A request reads the longest readable, unexpired breakpoint
prefix and writes an entry at every eligible breakpoint longer than what it read (`plan`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from laneflow_dev.imitation.prompt import Prompt

SWEEP_EVERY = 256  # requests between two sweeps of the expired entries


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
