"""The warm gate across runs (README, "The cache across runs"): a lead, or a lone step, whose
prefix another run's step is writing right now waits for that writer's first event, as a
sibling waits for its lead, then starts and reads it; a lead whose prefix is warm releases
its siblings at once.

In the definition a lead's or a lone step's Map iteration passes WaitForPrefix (a callback,
the WaitForLead function, at most 60 s) before its RunStarter: `wait_for_prefix` keeps its
token in the prefix's record if another run's attempt is writing it (the writer hands the
tokens back when its reply begins, or when its attempt ends without one; reconcile when its
worker is gone), else completes it at once. Where the writer is another process on the same
store (several `laneflow run`, or `serve` drives), its completion cannot reach this process's
engine: a local `PrefixWatch` (Services.prefix_watch) then watches the record and completes
the token itself.

Then the attempt (`PrefixClaimant`, in the step runner) claims the prefix: warm (read it,
hold no sibling), its own to write (its first event marks it written), or still another's
(the wait timed out: it goes on, and writes it). The stub model takes no part: its pretend
cache lives in one process, so a record of it in a shared store would be a claim about a
cache another process does not have.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from laneflow.domain.cache import cache_iso
from laneflow.domain.cache_ttl import choose_for
from laneflow.domain.messages import LaneKey, WaitForLeadReport, WaitForLeadRequest
from laneflow.domain.prefixes import PrefixClaim, PrefixTTL, PrefixWaiter, PrefixWriter, registered, waiting_line, warm_line
from laneflow.domain.records import Event, EventType, Run, StepStatus
from laneflow.ports import Services, StepJob

if TYPE_CHECKING:
    from laneflow.usecases.run_step.recorder import StepRecorder

log = logging.getLogger("laneflow.gate")


def hand_back(svc: Services, waiters: list[PrefixWaiter], why: str) -> int:
    """Complete the kept tokens of steps waiting for a prefix's writer; how many were still there."""
    if not waiters:
        return 0
    gone = set(svc.callbacks.succeed_all([w.token for w in waiters], {"released": why}))
    return sum(1 for w in waiters if w.token not in gone)


def wait_for_prefix(svc: Services, req: WaitForLeadRequest) -> WaitForLeadReport:
    """A lead or a lone step arrives before its RunStarter: wait (holding no worker) if
    another run's step is writing its prefix now, else go on at once."""
    from laneflow.usecases.run_step.cache_break import agent_prefix_key  # the runner's own key
    from laneflow.usecases.run_step.runner import prepare

    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index

    def go(why: str) -> WaitForLeadReport:
        svc.callbacks.succeed(req.token, {"released": why})
        return WaitForLeadReport(index=index, waiting=False)

    step = svc.store.get_step(tenant, run_id, index)
    if step.status != StepStatus.pending or not (svc.settings.prefix_registry and registered(step.model)):
        return go("nothing to wait for")
    run = svc.store.get_run(tenant, run_id, steps=False, input=False)
    if run.stop_requested or run.status.ended:
        return go("the run is stopping")
    try:
        prepared = prepare(svc, run, step)
    except Exception:  # the attempt meets the same failure and records it
        return go("its prompt could not be built")
    try:
        key = agent_prefix_key(step.model, prepared.prompt.stable, prepared.agent)
    finally:
        prepared.copy.discard()
    now = svc.cache_now()
    # First come writes: claimed for the step's next attempt (n 0), which takes it on.
    claim = svc.store.prefix_claim(
        tenant, key, model=step.model, writer=PrefixWriter(run_id=run_id, index=index, n=0, claimed_at=now), now=now
    )
    if claim.state == "warm" and req.step.role == "lead":
        # Its siblings go now, not once its attempt has been claimed and its prompt built again.
        from laneflow.usecases.wait_for_lead import open_gate

        text, _ = warm_note(claim)
        open_gate(
            svc,
            tenant,
            run_id,
            group=req.group,
            cycle=req.cycle,
            lane=req.lane,
            lead=index,
            why="the lead's prefix is warm",
            note=text,
        )
    if claim.state != "wait":
        return go("its prefix is warm" if claim.state == "warm" else "it writes its prefix")
    waits_on = svc.store.prefix_wait(tenant, key, PrefixWaiter(token=req.token, run_id=run_id, index=index, since=now), now=now)
    if waits_on is None or waits_on.writer is None:
        return go("its prefix's writer began meanwhile")
    writer = waits_on.writer.run_id
    agent = LaneKey.parse(req.lane).agent
    data = {"prefix": key, "waits_for": writer, "writer_index": waits_on.writer.index}
    svc.store.add_event(tenant, run_id, index, Event(type=EventType.gate, text=waiting_line(writer, agent), data=data))
    if svc.prefix_watch is not None:
        svc.prefix_watch.watch(tenant, key, req.token)
    return WaitForLeadReport(index=index, waiting=True)


@dataclass
class PrefixClaimant:
    """One attempt's side of its prefix's record: claim before the model call, mark it
    written at the first event, record reads, release on the way out."""

    svc: Services
    tenant: str
    run_id: str
    index: int
    n: int
    model: str
    key: str
    ttl: PrefixTTL = "5m"
    ttl_reason: str = ""
    writer: PrefixWriter | None = None
    began: bool = False

    @property
    def on(self) -> bool:
        return self.svc.settings.prefix_registry and registered(self.model)

    def claim(self) -> PrefixClaim | None:
        """Claim the prefix (a lead or a lone step); None when the model takes no part or the
        store could not say (the step goes on: the registry is a saving, never a gate that
        holds)."""
        if not self.on:
            return None
        now = self.svc.cache_now()
        writer = PrefixWriter(run_id=self.run_id, index=self.index, n=self.n, claimed_at=now)
        try:
            claimed = self.svc.store.prefix_claim(self.tenant, self.key, model=self.model, writer=writer, now=now)
        except Exception:
            log.warning("step %s of %s: its prefix could not be claimed", self.index, self.run_id, exc_info=True)
            return None
        if claimed.state == "write":
            self.writer = writer
        return claimed

    def first_event(self) -> None:
        """The attempt's reply began: if it writes the prefix, the prefix is written now."""
        if self.writer is None or self.began:
            return
        self.began = True
        try:
            waiters = self.svc.store.prefix_began(
                self.tenant,
                self.key,
                model=self.model,
                run_id=self.run_id,
                writer=self.writer,
                at=self.svc.cache_now(),
                ttl=self.ttl,
            )
        except Exception:
            log.warning("step %s of %s: its prefix's record could not be written", self.index, self.run_id, exc_info=True)
            return
        hand_back(self.svc, waiters, f"run {self.run_id}'s reply began")

    def first_call(self, cache_read: int, cache_write: int) -> None:
        """What the attempt's first call did to the cache: a read keeps the prefix warm; a
        write by an attempt that held no claim (a sibling whose lead could not open the gate
        in time) marks it written too."""
        if not self.on or (cache_write and self.writer is not None):
            return
        try:
            if cache_read:
                self.svc.store.prefix_read(self.tenant, self.key, model=self.model, run_id=self.run_id, at=self.svc.cache_now())
            elif cache_write:
                self.svc.store.prefix_began(
                    self.tenant,
                    self.key,
                    model=self.model,
                    run_id=self.run_id,
                    writer=None,
                    at=self.svc.cache_now(),
                    ttl=self.ttl,
                )
        except Exception:
            log.warning("step %s of %s: its prefix's read could not be kept", self.index, self.run_id, exc_info=True)

    def release(self, why: str) -> None:
        """The attempt ended: a claim whose reply never began goes, and its waiters start."""
        if self.writer is None or self.began:
            return
        writer, self.writer = self.writer, None
        try:
            waiters = self.svc.store.prefix_release(self.tenant, self.key, writer)
        except Exception:
            log.warning("step %s of %s: its prefix's claim could not be released", self.index, self.run_id, exc_info=True)
            return
        hand_back(self.svc, waiters, why)


def warm_note(claim: PrefixClaim) -> tuple[str, dict[str, object]]:
    """The trace line of a lead whose prefix is warm, and its data."""
    record = claim.record
    since = cache_iso(record.written_at or record.last_use() or 0.0)
    return warm_line(since, record.warmed_by), {"warm_since": since, "warmed_by": record.warmed_by, "prefix": record.key}


class _Notes(Protocol):
    def __call__(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None: ...


class _Opener(Protocol):
    def __call__(self, why: str, at: str | None = None, note: str | None = None) -> int: ...


def attempt_claimant(
    svc: Services,
    run: Run,
    job: StepJob,
    recorder: StepRecorder,
    *,
    role: str,
    note: _Notes,
    open_gate: _Opener | None,
) -> tuple[PrefixClaimant, StepJob]:
    """The attempt's claimant of its prefix, its recorder's hooks set, and its job with the
    TTL its writes ask for: a lead or a lone step claims the prefix now (a lead whose prefix
    is warm opens its gate at once and says so), and its TTL counts how long ago the prefix
    was last used (laneflow.domain.cache_ttl); every attempt's first call keeps the record
    (a read keeps it warm). A sibling takes the TTL the run's start chose for its agent."""
    from laneflow.usecases.run_step.cache_break import job_prefix_key

    claimant = PrefixClaimant(svc, job.tenant, job.run_id, job.index, job.attempt, job.model, job_prefix_key(job))
    claim = claimant.claim() if role != "sibling" else None
    gap = None
    if claim is not None and claim.state != "warm" and (last := claim.record.last_use()) is not None:
        gap = svc.cache_now() - last
    ttl, claimant.ttl_reason = choose_for(run.options, job.agent, job.model, last_use_gap_s=gap)
    claimant.ttl = "1h" if ttl == "1h" else "5m"
    job = dataclasses.replace(job, cache_ttl=claimant.ttl)
    if claim is not None and claim.state == "warm":
        text, data = warm_note(claim)
        note(EventType.gate, text, data)
        if open_gate is not None:
            open_gate("the lead's prefix is warm", note=text)
    elif claim is not None and claim.state == "wait" and claim.record.writer is not None:
        writer = claim.record.writer.run_id
        note(
            EventType.gate,
            f"prompt cache: run {writer}'s step is still writing this prefix; this one goes on without it",
            {"prefix": claimant.key, "waits_for": writer},
        )
    before = recorder.on_first_event

    def first_event() -> None:
        if before is not None:
            before()  # the lane's own gate first: its siblings are the nearer saving
        claimant.first_event()

    recorder.on_first_event = first_event
    recorder.on_first_call = lambda span: claimant.first_call(span.tokens.cache_read, span.tokens.cache_write)
    return claimant, job
