"""The rule book's rules of attempts: claims (numbering, the claim journal's replay), fenced
writes (ends, heartbeats, spans, prompt layers), the claim journal, and the trace."""

from __future__ import annotations

import time
from collections.abc import Collection

from laneflow.adapters.store.primitives import AttemptWrite, Claim, Refused, StepState
from laneflow.adapters.store.rulebook_base import (
    CLAIM_TRIES,
    WRITE_TRIES,
    RuleBase,
    _entry,
    _values,
    attempt_ended,
    refuse_status,
    statuses,
)
from laneflow.domain.errors import Conflict, NotFound, RunNotFound
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    FailureKind,
    JournalEntry,
    JournalStatus,
    ModelCall,
    PromptLayer,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.tenants import check_tenant
from laneflow.domain.workers import WorkerRef


class AttemptRules(RuleBase):
    """The public methods of attempts, the claim journal and the trace."""

    # -- attempts -----------------------------------------------------------------------

    def _attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        found = self._read_attempts(tenant, run_id, index=index, n=n)
        if not found:  # no such attempt, step or run
            raise NotFound(f"no attempt {n} of step {index} in run {run_id!r}")
        return found[0]

    @_entry("worker", "message")
    def claim_attempt(
        self,
        tenant: str,
        run_id: str,
        index: int,
        *,
        token: str,
        started_at: str,
        op_id: str | None = None,
        expect_status: Collection[StepStatus] = (StepStatus.pending,),
        journal_ttl_s: int = 7 * 24 * 3600,
        worker: WorkerRef | None = None,
        layers: list[PromptLayer] | None = None,
        message: str | None = None,
    ) -> Attempt:
        check_tenant(tenant)
        expected = statuses(expect_status)
        what = f"step {index} of run {run_id!r}"
        for _ in range(CLAIM_TRIES):
            state = self._read_step_state(tenant, run_id, index, op_id)
            if state is None:
                raise self._missing_step(tenant, run_id, index)
            entry = state.entry
            if entry is not None and entry.status == JournalStatus.completed:
                # A re-delivered invocation: it gets what the first one got, nothing new.
                return self._attempt(tenant, run_id, entry.index, entry.attempt or 0)
            if entry is not None and entry.status == JournalStatus.cancelled:
                raise Conflict(f"operation {op_id!r} was cancelled: its claim never landed")
            if state.status not in expected:
                raise refuse_status(what, state.status, expected)
            if state.running is not None:
                raise Conflict(f"{what} already has a running attempt ({state.running})")
            # Normally attempts + 1. Should a loop reset lower `attempts`, numbers still go up:
            # an attempt's number is part of its identity and is never reused.
            n = max(state.attempts, state.last_n) + 1
            attempt = Attempt(run_id=run_id, index=index, n=n, token=token, started_at=started_at, op_id=op_id, worker=worker)
            completed = None
            if op_id is not None:
                begun = entry or JournalEntry(
                    tenant=tenant, run_id=run_id, op_id=op_id, index=index, expires_at=int(time.time()) + journal_ttl_s
                )
                completed = begun.model_copy(
                    update={"status": JournalStatus.completed, "attempt": n, "token": token, "started_at": started_at}
                )
            claim = Claim(
                attempt=attempt, layers=layers, message=message, entry=completed, created=op_id is not None and entry is None
            )
            try:
                self._write_claim(tenant, run_id, claim, state)
            except Refused:
                continue  # read again: the refusal's reason is what the step now says
            return attempt
        raise Conflict(f"{what} kept changing while it was claimed; try again")

    @_entry()
    def get_attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        check_tenant(tenant)
        return self._attempt(tenant, run_id, index, n)

    @_entry()
    def list_attempts(self, tenant: str, run_id: str, index: int | None = None) -> list[Attempt]:
        check_tenant(tenant)
        found = self._read_attempts(tenant, run_id, index=index)
        if found is None:
            raise RunNotFound(run_id)
        return sorted(found, key=lambda a: (a.index, a.n))

    def _fenced(self, ref: AttemptRef, write: AttemptWrite) -> None:
        check_tenant(ref.tenant)
        try:
            self._write_attempt(ref, write)
        except Refused as refused:
            raise attempt_ended(ref, refused.found) from None

    @_entry("reason", "step", "calls")
    def end_attempt(
        self,
        ref: AttemptRef,
        status: AttemptStatus,
        *,
        reason: str | None = None,
        step: StepChanges | None = None,
        calls: list[ModelCall] | None = None,
        reason_kind: FailureKind | None = None,
    ) -> None:
        status = AttemptStatus(status)
        if status is AttemptStatus.running:
            raise ValueError("an attempt cannot be ended as running")
        kind = None if reason_kind is None else FailureKind(reason_kind)
        write = AttemptWrite(
            status=status, ended_at=utcnow(), reason=reason, reason_kind=kind, step=_values(step), calls=list(calls or [])
        )
        self._fenced(ref, write)

    @_entry()
    def heartbeat(self, ref: AttemptRef, at: str) -> None:
        self._fenced(ref, AttemptWrite(heartbeat_at=at))

    @_entry()
    def running_attempts(self, tenant: str | None = None) -> list[tuple[str, Attempt]]:
        if tenant is not None:
            check_tenant(tenant)
        return sorted(self._running_attempts(tenant), key=lambda ta: (ta[0], ta[1].run_id, ta[1].index, ta[1].n))

    # -- the claim journal ----------------------------------------------------------------

    @_entry()
    def journal_begin(self, tenant: str, run_id: str, op_id: str, index: int, *, ttl_s: int = 7 * 24 * 3600) -> JournalEntry:
        check_tenant(tenant)
        entry = JournalEntry(tenant=tenant, run_id=run_id, op_id=op_id, index=index, expires_at=int(time.time()) + ttl_s)
        seen: StepState | None = None  # the first write is made blind: the common case
        for _ in range(WRITE_TRIES):
            try:
                self._write_entry(entry, seen)
                return entry
            except Refused:
                seen = self._read_step_state(tenant, run_id, index, op_id)
            if seen is None:
                raise self._missing_step(tenant, run_id, index)
            if seen.entry is not None:
                return seen.entry  # a replay: the entry as it is
        raise Conflict(f"step {index} of run {run_id!r} kept changing while {op_id!r} was journaled; try again")

    @_entry()
    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        if tenant is not None:
            check_tenant(tenant)
        return sorted(self._pending_entries(tenant), key=lambda e: e.created_at)

    @_entry()
    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        check_tenant(tenant)
        index: int | None = None  # the journal is not told which step an op_id names
        for _ in range(WRITE_TRIES):
            state = self._read_step_state(tenant, run_id, index, op_id)
            entry = state.entry if state is not None else None
            if state is None or entry is None:
                raise NotFound(f"no journal entry {op_id!r} in run {run_id!r}")
            if entry.status != JournalStatus.pending:
                return entry
            if state.landed is not None:
                got = state.landed
                identity = {"attempt": got.n, "token": got.token, "started_at": got.started_at, "resumed_at": got.resumed_at}
                settled = entry.model_copy(update={"status": JournalStatus.completed, **identity})
            else:
                settled = entry.model_copy(update={"status": JournalStatus.cancelled})
            try:
                self._write_entry(settled, state)
                return settled
            except Refused:  # claimed, settled or joined meanwhile: look again
                index = state.index
        raise Conflict(f"the journal entry {op_id!r} of run {run_id!r} kept changing while it was settled; try again")

    # -- trace --------------------------------------------------------------------------

    @_entry("event")
    def add_event(self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None) -> None:
        check_tenant(tenant)
        if attempt is None:
            if self._read_step_state(tenant, run_id, index, None) is None:  # steps are never deleted: a read is enough
                raise self._missing_step(tenant, run_id, index)
            self._append(tenant, run_id, index, event, None)
            return
        if (attempt.tenant, attempt.run_id, attempt.index) != (tenant, run_id, index):
            raise ValueError(
                f"the attempt named (run {attempt.run_id!r}, step {attempt.index}) is not of run {run_id!r}, step {index}"
            )
        try:
            self._append(tenant, run_id, index, event.model_copy(update={"attempt": attempt.n}), attempt)
        except Refused as refused:
            raise attempt_ended(attempt, refused.found) from None

    @_entry("call")
    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        self._fenced(ref, AttemptWrite(calls=[call]))

    @_entry()
    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        self._fenced(ref, AttemptWrite(layers=list(layers)))
