"""The store's rule book: every rule of `ports.Store`, once, over a few primitives.

`RuleBookStore` implements every public method of `Store`. It owns what the stores agree on:
the tenant check at every entry point, the masking of every write, the refusals and their
messages, attempt numbering, the claim journal's replay, what a fence means, costs rounded,
and what a damaged record does (a read raises `RecordDamaged`, a list passes over it). A
backend (SQLite, DynamoDB) implements the primitives: each is one read, or one
conditional write that either lands whole or raises `Refused` having written nothing, and
none decides anything the rules decide. (The model is an idempotency persistence layer
whose base class holds the protocol and whose backends put and get records.)

Decisions are optimistic: the rules read what a write depends on (`_read_step_state`),
decide, and write conditionally on what they read (`seen`); a write refused because the
step changed meanwhile is decided again on what it now holds. A refusal's reason is always
read, never guessed, so every store refuses the same things with the same words.

The primitives, one read or one conditional write each, are listed (with what they
exchange: `StepState`, `Claim`, `AttemptWrite`, `Fenced`, `Refused`) in
laneflow.adapters.store.primitives.

A store the infrastructure cannot serve now (throttled, locked past its timeout) raises
`TransientError` from its primitives; the state machine retries it by name.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from laneflow.adapters.store.encoding import cost
from laneflow.adapters.store.primitives import AttemptWrite, Claim, Doc, Fenced, Primitives, Refused, StepState
from laneflow.domain.errors import AttemptEnded, Conflict, NotFound, RecordDamaged, RunNotFound
from laneflow.domain.gate import GatePass, GateWaiter
from laneflow.domain.inbox import Note, NoteKind, QuestionStatus
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.records import (
    READ_JSON,
    Attempt,
    AttemptRef,
    AttemptStatus,
    Changes,
    Event,
    FailureKind,
    JournalEntry,
    JournalStatus,
    ModelCall,
    PromptLayer,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redaction import Redactor
from laneflow.domain.tenants import check_tenant
from laneflow.domain.workers import WorkerRef
from laneflow.ports import Store

log = logging.getLogger("laneflow.store")

ACTIVE = (RunStatus.queued.value, RunStatus.running.value, RunStatus.awaiting_approval.value)

CLAIM_TRIES = 20  # decisions made again when the step changed between the read and the write

# Conditional writes made again when what they are conditional on changed meanwhile (a
# journal entry begun or settled, a fenced write whose step item moved on): each try reads
# what the last refusal found, so more than a few means writers racing without end.
WRITE_TRIES = 10


# Each write, and the arguments of it that carry recorded text (results, instructions,
# messages, reasons, events, spans, handoffs, inputs...): masked before it is written.
REDACTED_WRITES: dict[str, tuple[str, ...]] = {
    "create_run": ("run",),
    "update_run": ("changes",),
    "add_steps": ("steps",),
    "update_step": ("changes",),
    "claim_attempt": ("worker", "message"),
    "end_attempt": ("reason", "step", "calls"),
    "add_event": ("event",),
    "put_call": ("call",),
    "put_handoff": ("text",),
    "post_note": ("note",),
    "answer_question": ("text",),
}

# Writes that carry only keys, identities, times, statuses and hashes: nothing to mask.
UNMASKED_WRITES = frozenset(
    {
        "request_stop",
        "add_run_cost",
        "heartbeat",
        "journal_begin",
        "journal_settle",
        "set_prompt_layers",
        "gate_wait",
        "gate_open",
        "close_question",
        "observe",
    }
)

_PUBLIC = frozenset(name for name, member in vars(Store).items() if getattr(member, "__isabstractmethod__", False))


# -- messages ---------------------------------------------------------------------------------


def statuses(values: Collection[Any]) -> list[str]:
    if isinstance(values, str):  # one status given bare (a StrEnum is a str too)
        values = [values]
    return [str(getattr(v, "value", v)) for v in values]


def refuse_status(what: str, found: str, expected: Collection[Any]) -> Conflict:
    return Conflict(f"{what} is {found}, not {' or '.join(statuses(expected)) or 'any status'}")


def attempt_ended(ref: AttemptRef, found: Fenced) -> AttemptEnded:
    what = f"attempt {ref.n} of step {ref.index} of run {ref.run_id!r}"
    stored = found.attempt
    if stored is None:
        return AttemptEnded(f"{what} has ended" if 0 < ref.n <= found.last_n else f"{what} does not exist")
    if (stored.token, stored.started_at, stored.resumed_at) != (ref.token, ref.started_at, ref.resumed_at):
        return AttemptEnded(f"{what} is not the attempt named (its token or times differ); it is {stored.status}")
    return AttemptEnded(f"{what} has ended ({stored.status})")


def damaged(what: str, fields: list[str]) -> RecordDamaged:
    """A stored record whose named fields do not parse (a NaN written before entrances
    refused it, a hand edit)."""
    fields = fields or ["record"]
    verb = "is" if len(fields) == 1 else "are"
    return RecordDamaged(f"{what} cannot be read from the store: its {' and '.join(fields)} {verb} not valid JSON")


def trace_damaged(what: str) -> RecordDamaged:
    return RecordDamaged(f"{what} cannot be read from the store: its trace does not parse")


def misfit(what: str, error: ValidationError) -> RecordDamaged:
    """A stored record that no longer fits its model (hand-edited, or of another version)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "record"
    return RecordDamaged(f"{what} cannot be read from the store: its {where} does not fit ({first.get('msg', 'invalid')})")


def no_step(index: int, run_id: str) -> NotFound:
    return NotFound(f"no step {index} in run {run_id!r}")


# -- the entry points' wrapper ------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _entry(*masked: str) -> Callable[[_F], _F]:
    """A public method: counted under its own name (`_operation`), its named arguments
    masked by the store's redactor before anything else sees them."""

    def wrap(method: _F) -> _F:
        signature = inspect.signature(method)

        @functools.wraps(method)
        def entry(self: RuleBookStore, *args: Any, **kwargs: Any) -> Any:
            redactor = self.redactor
            if masked and redactor:  # nothing to mask: no cost on the write path
                bound = signature.bind(self, *args, **kwargs)
                for name in masked:
                    if name in bound.arguments:
                        bound.arguments[name] = redactor.value(bound.arguments[name])
                args, kwargs = bound.args[1:], bound.kwargs
            with self._operation(method.__name__):
                return method(self, *args, **kwargs)

        entry.__masks__ = masked  # type: ignore[attr-defined]
        return entry  # type: ignore[return-value]

    return wrap


_RUNS = TypeAdapter(list[Run], config=READ_JSON)

# Runs whose input a store keeps parsed (`get_run_input`): a run's input never changes, and a
# fan-out's steps each need it (100,000 items parse in ~20 ms). Few: an input can be large.
INPUTS_KEPT = 4


class _RunInput(BaseModel):
    model_config = READ_JSON  # its items are read once each: none kept in pydantic's cache
    input: Any = Field(default_factory=dict)  # as `Run.input`


_STEPS = TypeAdapter(list[Step], config=READ_JSON)

_M = TypeVar("_M", bound=BaseModel)


def _model(model: type[_M], doc: Doc, what: str) -> _M:
    try:
        return model.model_validate_json(doc) if isinstance(doc, str) else model.model_validate(doc)
    except ValidationError as error:
        raise misfit(what, error) from None


def _readable(rows: list[tuple[str, Doc | RecordDamaged]]) -> list[Run]:
    """The runs of (id, record) rows, leaving out - with a warning naming it - any that
    cannot be read, so one damaged run never stops a list (or reconcile)."""
    docs: list[tuple[str, Doc]] = []
    for run_id, doc in rows:
        if isinstance(doc, RecordDamaged):
            log.warning("run %s left out: %s", run_id, doc)
        else:
            docs.append((run_id, doc))
    if docs and all(isinstance(doc, str) for _, doc in docs):
        try:  # one validation of them all: the common case
            return _RUNS.validate_json("[" + ",".join(doc for _, doc in docs) + "]")  # type: ignore[misc]
        except ValidationError:
            pass
    runs = []
    for run_id, doc in docs:
        try:
            runs.append(_model(Run, doc, f"run {run_id!r}"))
        except RecordDamaged as error:
            log.warning("run %s left out: %s", run_id, error)
    return runs


def _values(changes: Changes | None) -> dict[str, Any]:
    values = changes.changed() if changes is not None else {}
    if "cost_usd" in values:
        values["cost_usd"] = cost(values["cost_usd"])
    return values


# -- the rule book ---------------------------------------------------------------------------------


class RuleBookStore(Primitives, Store):
    """Every public method of `Store`, over the primitives a backend implements."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__mro__[: cls.__mro__.index(RuleBookStore)]  # the backend's classes (parts included)
        overridden = sorted(_PUBLIC & {name for klass in own for name in vars(klass)})
        if overridden:
            raise TypeError(
                f"{cls.__name__} overrides {', '.join(overridden)}: a backend implements the primitives,"
                " the rules are RuleBookStore's"
            )

    @property
    def redactor(self) -> Redactor:
        found: Redactor | None = self.__dict__.get("_redactor")
        if found is None:
            found = self.__dict__.setdefault("_redactor", Redactor())
        return found

    @contextmanager
    def _operation(self, name: str) -> Iterator[None]:
        """Around each public method (a backend counts what it consumes by method)."""
        yield

    # -- runs ---------------------------------------------------------------------------

    @_entry("run")
    def create_run(self, run: Run) -> None:
        check_tenant(run.tenant)
        try:
            self._insert_run(run)
        except Refused:
            raise Conflict(f"run {run.id!r} exists") from None

    @_entry()
    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True, input: bool = True) -> Run:
        check_tenant(tenant)
        doc = self._read_run(tenant, run_id, steps=steps, detail=detail and steps, input=input)
        if doc is None:
            raise RunNotFound(run_id)
        run = _model(Run, doc, f"run {run_id!r}")
        return run if input else run.model_copy(update={"input": None})

    @_entry()
    def get_run_input(self, tenant: str, run_id: str) -> Any:
        check_tenant(tenant)
        inputs, lock = self._inputs()
        key = (tenant, run_id)
        with lock:
            if key in inputs:
                inputs.move_to_end(key)
                return inputs[key]
        doc = self._read_input(tenant, run_id)
        if doc is None:
            raise RunNotFound(run_id)
        value = _model(_RunInput, doc, f"run {run_id!r}").input
        with lock:
            inputs[key] = value
            while len(inputs) > INPUTS_KEPT:
                inputs.popitem(last=False)
        return value

    def _inputs(self) -> tuple[OrderedDict[tuple[str, str], Any], threading.Lock]:
        """The inputs this store keeps parsed, by (tenant, run id), and their lock (a forked
        child starts its own: a parent's thread may have held the lock at the fork)."""
        found: tuple[int, OrderedDict[tuple[str, str], Any], threading.Lock] | None = self.__dict__.get("_kept_inputs")
        if found is None or found[0] != os.getpid():
            found = (os.getpid(), OrderedDict(), threading.Lock())
            self.__dict__["_kept_inputs"] = found
        return found[1], found[2]

    @_entry()
    def list_runs(self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None) -> list[Run]:
        check_tenant(tenant)
        wanted = statuses(status) if status is not None else None
        if wanted is not None and not wanted:
            return []
        return _readable(self._list_runs(tenant, limit, wanted))

    @_entry("changes")
    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: RunChanges,
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_drives: int = 0,
    ) -> Run:
        check_tenant(tenant)
        values = _values(changes)
        if add_drives and "drives" in values:  # an amount to add lands on the value set
            values["drives"] += add_drives
            add_drives = 0
        expected = statuses(expect_status) if expect_status is not None else None
        what = f"run {run_id!r}"
        if not values and not add_drives:
            doc = self._read_run(tenant, run_id, steps=False, detail=False)
            if doc is None:
                raise RunNotFound(run_id)
            run = _model(Run, doc, what)
            if expected is not None and run.status.value not in expected:
                raise refuse_status(what, run.status.value, expected)
            return run
        try:
            doc = self._update_run(tenant, run_id, values, expected=expected, add_drives=int(add_drives))
        except Refused as refused:
            if refused.found is None:
                raise RunNotFound(run_id) from None
            raise refuse_status(what, refused.found, expected or ()) from None
        return _model(Run, doc, what)

    @_entry()
    def request_stop(self, tenant: str, run_id: str) -> bool:
        check_tenant(tenant)
        done = self._request_stop(tenant, run_id)
        if done is None:
            raise RunNotFound(run_id)
        return done

    @_entry()
    def add_run_cost(self, tenant: str, run_id: str, usd: float) -> float | None:
        check_tenant(tenant)
        amount = float(usd)
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"a cost to add is a finite amount of 0 or more, not {usd!r}")
        try:
            return self._add_run_cost(tenant, run_id, cost(amount), expected=list(ACTIVE))
        except Refused as refused:
            if refused.found is None:
                raise RunNotFound(run_id) from None
            return None

    # -- steps --------------------------------------------------------------------------

    def _missing_step(self, tenant: str, run_id: str, index: int) -> NotFound:
        return no_step(index, run_id) if self._run_exists(tenant, run_id) else RunNotFound(run_id)

    def _steps(self, docs: list[tuple[int, Doc]], run_id: str) -> list[Step]:
        if docs and all(isinstance(doc, str) for _, doc in docs):
            try:
                return _STEPS.validate_json("[" + ",".join(doc for _, doc in docs) + "]")  # type: ignore[misc]
            except ValidationError:
                pass  # said below, naming the step
        return [_model(Step, doc, f"step {index} of run {run_id!r}") for index, doc in docs]

    @_entry()
    def get_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        group: int | None = None,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[Step]:
        check_tenant(tenant)
        docs = self._read_steps(tenant, run_id, group=group, messages=messages, where=where)
        if not docs and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return self._steps(docs, run_id)

    @_entry()
    def get_group_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        check_tenant(tenant)
        outline = self._read_outline(tenant, run_id)
        if not outline and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return outline

    @_entry()
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        check_tenant(tenant)
        docs = self._read_steps(tenant, run_id, index=index, detail=detail)
        if not docs:
            raise self._missing_step(tenant, run_id, index)
        return self._steps(docs, run_id)[0]

    @_entry()
    def get_step_status(self, tenant: str, run_id: str, index: int) -> tuple[StepStatus, int]:
        check_tenant(tenant)
        state = self._read_step_state(tenant, run_id, index, None)
        if state is None:
            raise self._missing_step(tenant, run_id, index)
        try:
            return StepStatus(state.status), state.attempts
        except ValueError:  # as get_step would find it
            raise RecordDamaged(
                f"step {index} of run {run_id!r} cannot be read from the store: its status does not fit"
            ) from None

    @_entry("steps")
    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        check_tenant(tenant)
        try:
            added = self._insert_steps(tenant, run_id, steps)
        except Refused:
            raise Conflict(f"run {run_id!r}: a step index among {[s.index for s in steps]} is taken") from None
        if not added:
            raise RunNotFound(run_id)

    @_entry("changes")
    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: StepChanges,
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        check_tenant(tenant)
        values = _values(changes)
        expected = statuses(expect_status) if expect_status is not None else None
        what = f"step {index} of run {run_id!r}"
        if not values:
            step = self.get_step(tenant, run_id, index)
            if expected is not None and step.status.value not in expected:
                raise refuse_status(what, step.status.value, expected)
            return step
        try:
            doc = self._update_step(tenant, run_id, index, values, expected=expected)
        except Refused as refused:
            if refused.found is None:
                raise self._missing_step(tenant, run_id, index) from None
            raise refuse_status(what, refused.found, expected or ()) from None
        return _model(Step, doc, what)

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

    # -- active runs ----------------------------------------------------------------------

    @_entry()
    def active_runs(self, tenant: str | None = None) -> list[Run]:
        if tenant is not None:
            check_tenant(tenant)
        return _readable(self._active_runs(tenant))

    # -- trace --------------------------------------------------------------------------

    @_entry("event")
    def add_event(self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None) -> None:
        check_tenant(tenant)
        if attempt is None:
            if self._read_step_state(tenant, run_id, index, None) is None:  # steps are never deleted: a read is enough
                raise self._missing_step(tenant, run_id, index)
            self._write_event(tenant, run_id, index, event, None)
            return
        if (attempt.tenant, attempt.run_id, attempt.index) != (tenant, run_id, index):
            raise ValueError(
                f"the attempt named (run {attempt.run_id!r}, step {attempt.index}) is not of run {run_id!r}, step {index}"
            )
        try:
            self._write_event(tenant, run_id, index, event.model_copy(update={"attempt": attempt.n}), attempt)
        except Refused as refused:
            raise attempt_ended(attempt, refused.found) from None

    @_entry("call")
    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        self._fenced(ref, AttemptWrite(calls=[call]))

    @_entry()
    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        self._fenced(ref, AttemptWrite(layers=list(layers)))

    # -- handoffs ------------------------------------------------------------------------

    @_entry("text")
    def put_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        check_tenant(tenant)
        if not self._run_exists(tenant, run_id):  # runs are never deleted: a read is enough
            raise RunNotFound(run_id)
        self._write_handoff(tenant, run_id, key, text)

    @_entry()
    def get_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        check_tenant(tenant)
        return self._read_handoff(tenant, run_id, key)

    # -- the warm gate ---------------------------------------------------------------------

    @_entry()
    def gate_wait(
        self, tenant: str, run_id: str, key: str, token: str, *, index: int | None = None, until_lead_ends: bool = False
    ) -> GatePass | None:
        check_tenant(tenant)
        return self._gate_wait(tenant, run_id, key, GateWaiter(token=token, index=index, until_lead_ends=until_lead_ends))

    @_entry()
    def gate_open(
        self, tenant: str, run_id: str, key: str, *, lead_ended: bool = False, note: str | None = None
    ) -> list[GateWaiter]:
        check_tenant(tenant)
        return self._gate_open(tenant, run_id, key, lead_ended=lead_ended, note=note)

    # -- inboxes (peers, ask) ----------------------------------------------------------------

    @_entry("note")
    def post_note(self, tenant: str, run_id: str, note: Note) -> None:
        check_tenant(tenant)
        if note.run_id != run_id:
            raise ValueError(f"the note names run {note.run_id!r}, not {run_id!r}")
        if self._read_step_state(tenant, run_id, note.to_index, None) is None:  # steps are never deleted
            raise self._missing_step(tenant, run_id, note.to_index)
        try:
            self._write_note(tenant, note, replaces_open=False)
        except Refused:
            raise Conflict(f"note {note.id!r} of run {run_id!r} exists") from None

    @_entry()
    def get_inbox(self, tenant: str, run_id: str, index: int | None = None) -> list[Note]:
        check_tenant(tenant)
        notes = self._read_notes(tenant, run_id)
        if not notes and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return sorted((n for n in notes if index is None or n.to_index == index), key=lambda n: (n.at, n.id))

    @_entry()
    def get_note(self, tenant: str, run_id: str, note_id: str) -> Note:
        check_tenant(tenant)
        found = self._note(tenant, run_id, note_id)
        if found is None:
            if not self._run_exists(tenant, run_id):
                raise RunNotFound(run_id)
            raise NotFound(f"no note {note_id!r} in run {run_id!r}")
        return found

    def _note(self, tenant: str, run_id: str, note_id: str) -> Note | None:
        found = self._read_notes(tenant, run_id, note_id)
        return found[0] if found else None

    def _question(self, tenant: str, run_id: str, note_id: str) -> Note:
        found = self._note(tenant, run_id, note_id)
        if found is None or found.kind != NoteKind.question:
            if not self._run_exists(tenant, run_id):
                raise RunNotFound(run_id)
            raise NotFound(f"no question {note_id!r} in run {run_id!r}")
        return found

    @_entry("text")
    def answer_question(self, tenant: str, run_id: str, note_id: str, text: str, *, at: str) -> Note:
        check_tenant(tenant)
        question = self._question(tenant, run_id, note_id)
        if question.status != QuestionStatus.open:
            raise Conflict(f"question {note_id!r} of step {question.to_index} is {question.status}, not open")
        answered = question.model_copy(update={"status": QuestionStatus.answered, "answer": text, "answered_at": at})
        try:
            self._write_note(tenant, answered, replaces_open=True)
        except Refused as refused:
            status = refused.found.status if isinstance(refused.found, Note) else "gone"
            raise Conflict(f"question {note_id!r} of step {question.to_index} is {status}, not open") from None
        return answered

    @_entry()
    def close_question(self, tenant: str, run_id: str, note_id: str) -> Note:
        check_tenant(tenant)
        question = self._question(tenant, run_id, note_id)
        if question.status != QuestionStatus.open:
            return question
        closed = question.model_copy(update={"status": QuestionStatus.expired})
        try:
            self._write_note(tenant, closed, replaces_open=True)
        except Refused as refused:
            if isinstance(refused.found, Note):
                return refused.found  # answered meanwhile: the answer wins
            raise
        return closed

    @_entry()
    def observe(self, ref: AttemptRef, ids: list[str]) -> None:
        check_tenant(ref.tenant)
        if not ids:
            return
        try:
            self._write_observed(ref, list(ids))
        except Refused as refused:
            raise attempt_ended(ref, refused.found) from None

    @_entry()
    def get_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        check_tenant(tenant)
        return self._read_observed(tenant, run_id, index)

    @_entry()
    def list_open_questions(self, tenant: str | None = None) -> list[tuple[str, Note]]:
        if tenant is not None:
            check_tenant(tenant)
        found = [(t, n) for t, n in self._open_questions(tenant) if n.status == QuestionStatus.open]
        return sorted(found, key=lambda tn: (tn[1].at, tn[1].id))
