"""The prompt cache across runs: the prefix registry's records and the rules that change them.

A prompt cache does not know runs: two runs whose steps share a model and the same cached
prefix (the tools and the stable layers up to the breakpoint) read each other's cache. The
store keeps one `PrefixRecord` per (tenant, prefix key): when a response that wrote the
prefix began (`written_at`), its last read (`read_at`), its TTL, the run that warmed it, and
the attempt writing it right now (`writer`), if any, with the callback tokens of the steps
waiting for that writer's first event (`waiters`).

- Warm: written or read within its TTL less WARM_MARGIN_S. A lead whose prefix is warm does
  not hold its siblings.
- Being written: another run's attempt claimed the prefix and its reply has not begun. A lead
  or a lone step then waits for that writer's first event, as a sibling waits for its lead,
  at most WRITER_WAIT_S; a writer claimed longer ago than that is taken over.
- The writer's first event marks the prefix written and hands back the waiters; its attempt
  ending any way without one releases the claim and hands them back too (they go on cold);
  reconcile releases a writer whose attempt is no longer running.

Times here are the cache clock's (`laneflow.domain.cache.cache_now`, epoch seconds). The
rules are pure: each takes the record as read and returns what to write (None: nothing), and
the store writes it only if the record's `version` is still the one read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

PrefixTTL = Literal["5m", "1h"]
TTL_S: dict[str, float] = {"5m": 300.0, "1h": 3600.0}

# A prefix counts as warm until this long before its entry would expire: a request sent at
# the edge of the TTL may find it gone by the time it arrives.
WARM_MARGIN_S = 30.0

# No step waits on another run's writer longer than this (a first token takes seconds; a
# writer whose worker died never begins): past it the claim is stale and is taken over.
WRITER_WAIT_S = 60.0

# A read refreshes `read_at` in the store at most this often per prefix: each refresh is a
# write, and a minute is small against the shortest TTL (5 minutes less the margin).
READ_REFRESH_S = 60.0

KEY_CHARS = 32

# Models whose cache no store could describe: the stub's pretend cache lives in one process,
# so a record of it in a shared store would be a claim about a cache another process lacks.
NOT_REGISTERED = frozenset({"stub"})


def registered(model: str) -> bool:
    """Whether steps on `model` keep the prefix registry (and wait for another run's writer)."""
    return model not in NOT_REGISTERED


def prefix_key(model: str, system_stable: str, tool_names: Iterable[str]) -> str:
    """A prefix's key within its tenant: its model, the tools it carries (in the stable order
    they are sent) and its stable system text, hashed."""
    text = "\x00".join([model, *sorted(tool_names), "\x01", system_stable])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_CHARS]


class PrefixWriter(BaseModel):
    """The attempt writing a prefix right now, and when it claimed it. `n` 0: the step's next
    attempt (claimed by its WaitForPrefix, before the attempt was)."""

    run_id: str
    index: int
    n: int
    claimed_at: float

    def same(self, other: PrefixWriter | None) -> bool:
        return other is not None and (self.run_id, self.index, self.n) == (other.run_id, other.index, other.n)

    def succeeds(self, other: PrefixWriter | None) -> bool:
        """`other` is this step's claim made before its attempt was (n = 0, by WaitForPrefix):
        this attempt takes it on."""
        return other is not None and other.n == 0 and (self.run_id, self.index) == (other.run_id, other.index)


class PrefixWaiter(BaseModel):
    """A step waiting for a prefix's writer: its callback token, its run and index."""

    token: str
    run_id: str
    index: int
    since: float


class PrefixRecord(BaseModel):
    key: str
    model: str
    written_at: float | None = None
    read_at: float | None = None
    ttl: PrefixTTL = "5m"
    warmed_by: str | None = None  # the run whose step wrote it (or, unknown, first read it)
    writer: PrefixWriter | None = None
    waiters: list[PrefixWaiter] = Field(default_factory=list)
    version: int = 0

    def last_use(self) -> float | None:
        uses = [t for t in (self.written_at, self.read_at) if t is not None]
        return max(uses) if uses else None

    def warm(self, now: float) -> bool:
        last = self.last_use()
        return last is not None and now - last < TTL_S[self.ttl] - WARM_MARGIN_S

    def warm_until(self) -> float | None:
        last = self.last_use()
        return None if last is None else last + TTL_S[self.ttl] - WARM_MARGIN_S

    def writing(self, now: float) -> bool:
        """Another attempt claimed it and has neither begun nor gone stale."""
        return self.writer is not None and now - self.writer.claimed_at < WRITER_WAIT_S

    def keeps_waiting(self, now: float) -> bool:
        """A step arriving now would wait for its writer: it is being written and not warm."""
        return self.writing(now) and not self.warm(now)

    def bumped(self, **changes: object) -> PrefixRecord:
        return self.model_copy(update={**changes, "version": self.version + 1})


ClaimState = Literal["warm", "write", "wait"]


@dataclass(frozen=True)
class PrefixClaim:
    """What `claim` decided: the prefix is warm (read it, hold nobody), this attempt writes
    it, or another run's attempt is writing it now (wait for it). `record` as it now stands."""

    state: ClaimState
    record: PrefixRecord


@dataclass(frozen=True)
class Change:
    """A rule's answer: the record to write (None: nothing to write) and the waiters it hands
    back (their tokens are completed by the caller)."""

    write: PrefixRecord | None = None
    handed: list[PrefixWaiter] = field(default_factory=list)


def claim(record: PrefixRecord | None, key: str, model: str, writer: PrefixWriter, now: float) -> tuple[PrefixClaim, Change]:
    """A lead or a lone step is about to send its prefix."""
    if record is not None and record.warm(now):
        return PrefixClaim("warm", record), Change()
    if record is not None and writer.same(record.writer):
        return PrefixClaim("write", record), Change()
    if record is not None and writer.succeeds(record.writer):
        new = record.bumped(writer=writer)
        return PrefixClaim("write", new), Change(write=new)
    if record is not None and record.writing(now):
        return PrefixClaim("wait", record), Change()
    base = record or PrefixRecord(key=key, model=model)
    # A stale writer is taken over; its waiters stay, handed back when this one begins.
    new = base.bumped(writer=writer)
    return PrefixClaim("write", new), Change(write=new)


def began(
    record: PrefixRecord | None, key: str, model: str, run_id: str, writer: PrefixWriter | None, at: float, ttl: PrefixTTL
) -> Change:
    """A response that wrote the prefix began (`writer`: the attempt, if it had claimed it):
    the prefix is written; if the claim was this attempt's, it ends and its waiters are
    handed back. Another attempt's claim stays (it will find the prefix warm)."""
    base = record or PrefixRecord(key=key, model=model)
    mine = writer is not None and writer.same(base.writer)
    new = base.bumped(
        written_at=max(at, base.written_at or 0.0),
        ttl="1h" if ttl == "1h" or (base.ttl == "1h" and base.warm(at)) else "5m",
        warmed_by=run_id,
        writer=None if mine else base.writer,
        waiters=[] if mine else base.waiters,
    )
    return Change(write=new, handed=list(base.waiters) if mine else [])


def read(record: PrefixRecord | None, key: str, model: str, run_id: str, at: float) -> Change:
    """A response read the prefix: its entry's TTL runs again from now. Written at most every
    READ_REFRESH_S."""
    if record is not None and record.read_at is not None and at - record.read_at < READ_REFRESH_S:
        return Change()
    base = record or PrefixRecord(key=key, model=model, warmed_by=run_id)
    return Change(write=base.bumped(read_at=max(at, base.read_at or 0.0)))


def release(record: PrefixRecord | None, writer: PrefixWriter) -> Change:
    """The writer's attempt ended without its reply beginning (or it is gone): its claim goes
    and its waiters are handed back (they start, and write the prefix themselves)."""
    if record is None or not writer.same(record.writer):
        return Change()
    return Change(write=record.bumped(writer=None, waiters=[]), handed=list(record.waiters))


def wait(record: PrefixRecord | None, waiter: PrefixWaiter, now: float) -> tuple[PrefixRecord | None, Change]:
    """A step arrives to wait for the prefix's writer with its callback token: kept if the
    prefix is being written by another run's attempt (returns the record it waits on), else
    nothing is kept (None: go on at once)."""
    if record is None or not record.keeps_waiting(now):
        return None, Change()
    assert record.writer is not None
    if record.writer.run_id == waiter.run_id and record.writer.index == waiter.index:
        return None, Change()  # its own earlier attempt
    if any(w.token == waiter.token for w in record.waiters):
        return record, Change()
    new = record.bumped(waiters=[*record.waiters, waiter])
    return new, Change(write=new)


def waiting_line(run_id: str, agent: str) -> str:
    return (
        f"prompt cache: waiting for run {run_id}'s {agent} step, which is writing this prefix now,"
        " to begin its reply, so this one reads it"
    )


def warm_line(since: str, run_id: str | None) -> str:
    by = f" (run {run_id})" if run_id else ""
    return f"prompt cache: prefix warm since {since}{by}, siblings start at once"
