"""The store port: every durable fact about runs, in conditional writes (two
implementations: `adapters/store/sqlite.py` and `adapters/store/dynamodb.py`)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from laneflow.domain.gate import GateClaim, GatePass, GateWaiter
from laneflow.domain.inbox import Note
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.prefixes import PrefixClaim, PrefixRecord, PrefixTTL, PrefixWaiter, PrefixWriter
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    FailureKind,
    JournalEntry,
    ModelCall,
    PromptLayer,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
)
from laneflow.domain.redaction import Redactor
from laneflow.domain.schedules import Firing, Schedule, ScheduleState
from laneflow.domain.workers import WorkerRef

log = logging.getLogger("laneflow.ports")


class Store(ABC):
    """Runs, steps, attempts, events, spans and prompt layers, keyed by tenant first.

    Every write is conditional, and says so: a refused write raises the domain's error
    (`Conflict`, `AttemptEnded`, `RunNotFound`, `NotFound`) and changed nothing. A tenant
    name no key can hold is `TenantInvalid` at every entry point. A stored record that no
    longer parses is `RecordDamaged` when it is read, and passed over by the lists. What is
    written is masked by `redactor` first. A store the infrastructure cannot serve now (a
    throttled table, a database locked past its timeout) raises `TransientError`, which the
    state machine retries by name. (laneflow.adapters.store.rulebook keeps these rules once
    for every implementation.)"""

    url: str
    # What this store masks in everything it writes: `store.redactor.add(NAME, value)` and
    # from then on `value` is written as `[NAME]`. The services add the model's key. Read-only
    # (the rule book makes it); declared for the type checker alone, so that it is not one of
    # the public methods the rule book and the tests count.
    if TYPE_CHECKING:

        @property
        @abstractmethod
        def redactor(self) -> Redactor: ...

    # -- runs ---------------------------------------------------------------------------

    @abstractmethod
    def create_run(self, run: Run) -> None:
        """Write a new run with all of its steps, at once. `Conflict` if the id exists."""

    @abstractmethod
    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True, input: bool = True) -> Run:
        """The run with its steps ordered by index. With `detail`, each step carries its
        events (in order), calls (by `n`) and prompt layers. With `steps=False`, the run
        alone (its `steps` empty): the cheap read a handler makes. With `input=False`, its
        `input` is not read (it is None): a fan-out's input can be large, and a step reads
        it with `get_run_input`. `RunNotFound` if absent (also when it belongs to another
        tenant)."""

    @abstractmethod
    def get_run_input(self, tenant: str, run_id: str) -> Any:
        """The run's input, as it was created: it never changes, so a store may keep it
        parsed for the run's later steps, and the value returned may be shared by them
        (read it, never change it). `RunNotFound` if absent (also in another tenant)."""

    @abstractmethod
    def list_runs(
        self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None, before: str | None = None
    ) -> list[Run]:
        """The tenant's runs, newest first, without steps. With `before` (a run's id), only
        the runs that come after that run in this order: the page that follows a page ending
        with it (runs created since do not shift it). `RunNotFound` if `before` names no run
        of the tenant."""

    @abstractmethod
    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: RunChanges,
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_drives: int = 0,
    ) -> Run:
        """Change the fields `changes` names and add `add_drives` to the drives, all at once,
        only if the status is one of `expect_status` (when given). Returns the run as
        written (without steps). `Conflict` when refused, `RunNotFound` when absent."""

    @abstractmethod
    def request_stop(self, tenant: str, run_id: str) -> bool:
        """Set `stop_requested`. True if this call set it, False if it was already set."""

    @abstractmethod
    def add_run_cost(self, tenant: str, run_id: str, usd: float) -> float | None:
        """Add `usd` (a finite amount, 0 or more) to the cost of a run not yet ended, as one
        increment that concurrent adders never lose: what an attempt spent, as it ends, so the
        run's `cost_usd` is its spend so far inside a group too (its budget is checked against
        it before each step and each model turn). Returns the cost as written; None, adding
        nothing, when the run has ended (its cost is settled). `RunNotFound` if absent."""

    # -- steps --------------------------------------------------------------------------

    @abstractmethod
    def get_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        group: int | None = None,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[Step]:
        """Steps ordered by index (without events, calls or layers), of one group if given,
        and only those `where` admits (`laneflow.domain.outline.StepFilter`). With
        `messages=False` each step's `message` is left out (None): what a drive's decisions
        read, which the handoff blocks in a group's messages would make heavy."""

    @abstractmethod
    def get_group_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        """The run's groups in numbers, by group (`laneflow.domain.outline`): what a drive's
        decisions need of the steps they do not read whole. `RunNotFound` if absent."""

    @abstractmethod
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        """One step; with `detail`, its events, calls and prompt layers. `NotFound` if absent."""

    @abstractmethod
    def get_step_status(self, tenant: str, run_id: str, index: int) -> tuple[StepStatus, int]:
        """One step's status and attempts, as `get_step` would give them, without reading the
        step whole (what a handler reports). `NotFound` if absent."""

    @abstractmethod
    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        """Append new step records (rescue records). `Conflict` if an index is taken."""

    @abstractmethod
    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: StepChanges,
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        """Change the fields `changes` names of a step not scoped to an attempt (planning,
        skipping, loop resets). `Conflict` when the status is not one of `expect_status`."""

    # -- attempts -----------------------------------------------------------------------

    @abstractmethod
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
        """Claim the next attempt of a step, at once: a new attempt `n = step.attempts + 1`
        (running), the step `running` with `attempts = n` and `started_at` set on its first
        attempt. Only if the step's status is one of `expect_status` and it has no running
        attempt; otherwise `Conflict`. Attempt numbers never repeat, even should a loop
        reset lower `attempts`.

        With `op_id`, the claim and its journal entry are written together: the entry (made
        here if `journal_begin` did not) becomes `completed` with the attempt's identity. If
        the journal already holds a `completed` entry for `op_id`, nothing is claimed: the
        attempt that entry names is returned (a re-delivered invocation gets what the first
        one got, whatever the step's status now). An entry `cancelled` is a `Conflict`.

        `worker` (what works on the attempt) and `layers` (the step's prompt layers, as
        `set_prompt_layers` would write them), when given, are written with the claim, and
        so is `message`: the step's `message` becomes the user message this attempt is sent
        (kept as it was when None). A large message goes where the store keeps large values."""

    @abstractmethod
    def get_attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        """One attempt. `NotFound` if absent."""

    @abstractmethod
    def list_attempts(self, tenant: str, run_id: str, index: int | None = None) -> list[Attempt]:
        """Attempts of a run (or one step), ordered by index then n."""

    @abstractmethod
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
        """End a running attempt (with its `reason` and, for a failure, its `reason_kind`),
        and in the same write change its step (`step`) and record `calls` (spans, inserted
        or replaced by id, as `put_call` would). Fenced: `AttemptEnded` unless the stored
        attempt has exactly `ref`'s identity and is running."""

    @abstractmethod
    def heartbeat(self, ref: AttemptRef, at: str) -> None:
        """The attempt's worker is alive at `at`. Fenced like `end_attempt`."""

    @abstractmethod
    def running_attempts(self, tenant: str | None = None) -> list[tuple[str, Attempt]]:
        """(tenant, attempt) for every attempt still `running`, of one tenant or all, read
        from what is active only (a sparse index), never by scanning every run."""

    # -- the claim journal ---------------------------------------------------------------

    @abstractmethod
    def journal_begin(self, tenant: str, run_id: str, op_id: str, index: int, *, ttl_s: int = 7 * 24 * 3600) -> JournalEntry:
        """Record that a claim for `op_id` is about to be asked for (`pending`), unless an
        entry exists: then return that entry as it is (a replay)."""

    @abstractmethod
    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        """Entries still `pending` (a crash came between asking for a claim and getting it),
        read from what is active only, oldest first."""

    @abstractmethod
    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        """Settle a `pending` entry: `completed` with the attempt if a claim with this
        `op_id` landed, else `cancelled`. An entry already settled is returned as it is.
        `NotFound` if the journal holds no entry for `op_id`."""

    # -- active runs ----------------------------------------------------------------------

    @abstractmethod
    def active_runs(self, tenant: str | None = None) -> list[Run]:
        """Runs `queued`, `running` or `awaiting-approval` (without steps), of one tenant or
        all, oldest first, read from a sparse index of what is active: the cost grows with
        active runs, not with all runs."""

    # -- trace --------------------------------------------------------------------------

    @abstractmethod
    def add_event(self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None) -> None:
        """Append a trace line to a step. With `attempt`, fenced like `end_attempt` (and the
        event's `attempt` is set to its number)."""

    @abstractmethod
    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        """Insert a model-call span, or replace the one with the same `id` (a turn reported
        twice). Fenced like `end_attempt`."""

    @abstractmethod
    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        """Replace the step's prompt layers with those this attempt was built from. Fenced."""

    # -- handoffs ------------------------------------------------------------------------

    @abstractmethod
    def put_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        """Keep the handoff block a launching group's steps receive (written once by the
        planner, read by every step of the group), replacing one with the same key."""

    @abstractmethod
    def get_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        """The handoff block under `key`, or None if none was written."""

    # -- the warm gate ---------------------------------------------------------------------

    @abstractmethod
    def gate_wait(
        self, tenant: str, run_id: str, key: str, token: str, *, index: int | None = None, until_lead_ends: bool = False
    ) -> GatePass | None:
        """A sibling (step `index`) arrives at its lane's gate with its callback token. At
        once: if the gate is open, return a `GatePass` (the caller completes its own token;
        the pass carries the note the lead left, if any); otherwise keep the token for the
        lead and return None. With `until_lead_ends` (the reserve, laneflow.domain.gate) the
        gate counts as open only once the lead has ended, not when its reply began. Together
        with `gate_open` this is a rendezvous: whichever arrives second completes the token,
        so no sibling waits forever."""

    @abstractmethod
    def gate_open(
        self, tenant: str, run_id: str, key: str, *, lead_ended: bool = False, note: str | None = None
    ) -> list[GateWaiter]:
        """Open the gate (idempotent) and hand back, at once, the waiters kept so far that
        this opening releases: those waiting for the lead's reply, and with `lead_ended`
        the reserve too (the lead has ended). A waiter is handed back only once; a second
        call of the same kind returns []. `note` (kept by the first opening that gives one)
        is handed to every later `GatePass`."""

    @abstractmethod
    def gate_claim(self, tenant: str, run_id: str, key: str) -> GateClaim:
        """A gate whose lead is whoever comes first (a delegate's prefix: usecases.run_step.
        delegate_gate): "lead" for the caller that made the gate (it opens it with
        `gate_open`), then "wait" until it is opened, then "open". Nothing is kept for a
        caller that waits: it asks again."""

    # -- the prefix registry (the prompt cache across runs: laneflow.domain.prefixes) -------

    @abstractmethod
    def get_prefix(self, tenant: str, key: str) -> PrefixRecord | None:
        """The tenant's record of a prefix, or None if none was kept."""

    @abstractmethod
    def prefix_claim(self, tenant: str, key: str, *, model: str, writer: PrefixWriter, now: float) -> PrefixClaim:
        """A lead or a lone step is about to send its prefix: "warm" (nothing written), "wait"
        (another run's attempt is writing it now; nothing written), or "write" (`writer` now
        holds the claim, taken over from a stale one)."""

    @abstractmethod
    def prefix_began(
        self, tenant: str, key: str, *, model: str, run_id: str, writer: PrefixWriter | None, at: float, ttl: PrefixTTL
    ) -> list[PrefixWaiter]:
        """A response that wrote the prefix began at `at`; if `writer` held the claim it ends,
        and the waiters kept are handed back (each once)."""

    @abstractmethod
    def prefix_read(self, tenant: str, key: str, *, model: str, run_id: str, at: float) -> None:
        """A response read the prefix at `at` (kept at most every READ_REFRESH_S)."""

    @abstractmethod
    def prefix_release(self, tenant: str, key: str, writer: PrefixWriter) -> list[PrefixWaiter]:
        """`writer`'s attempt ended without its reply beginning (or is gone): its claim goes,
        and the waiters kept are handed back. Nothing if the claim is not its own."""

    @abstractmethod
    def prefix_wait(self, tenant: str, key: str, waiter: PrefixWaiter, *, now: float) -> PrefixRecord | None:
        """Keep `waiter`'s token for the prefix's writer and return the record it waits on,
        if another run's attempt is writing it now; else keep nothing and return None."""

    @abstractmethod
    def list_writing_prefixes(self, tenant: str | None = None) -> list[tuple[str, PrefixRecord]]:
        """(tenant, record) of every prefix an attempt holds the claim of, of one tenant or all."""

    # -- inboxes (peers, ask) ----------------------------------------------------------------

    @abstractmethod
    def post_note(self, tenant: str, run_id: str, note: Note) -> None:
        """Put a message or a question into step `note.to_index`'s inbox (its text masked).
        `Conflict` if the note's id is taken; `NotFound` / `RunNotFound` if there is no
        such step or run."""

    @abstractmethod
    def get_inbox(self, tenant: str, run_id: str, index: int | None = None) -> list[Note]:
        """The notes of step `index`'s inbox (of every step when None), oldest first.
        `RunNotFound` if there is no run."""

    @abstractmethod
    def get_note(self, tenant: str, run_id: str, note_id: str) -> Note:
        """One note of the run's inboxes. `NotFound` if there is none (`RunNotFound` if
        there is no run)."""

    @abstractmethod
    def answer_question(self, tenant: str, run_id: str, note_id: str, text: str, *, at: str) -> Note:
        """Answer an open question, once: it becomes `answered` with `text` (masked) at
        `at`. `NotFound` if there is no such question; `Conflict` naming its status if it is
        not open (answered already, or its step stopped waiting)."""

    @abstractmethod
    def close_question(self, tenant: str, run_id: str, note_id: str) -> Note:
        """The asking step stops waiting: an open question becomes `expired`. One that is
        not open (answered meanwhile) is returned as it is. `NotFound` if there is none."""

    @abstractmethod
    def observe(self, ref: AttemptRef, ids: list[str]) -> None:
        """This attempt has observed these notes (`Note.delivery_id`). Fenced like
        `end_attempt`."""

    @abstractmethod
    def get_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        """What each attempt of step `index` has observed: attempt number -> ids, in the
        order observed."""

    @abstractmethod
    def list_open_questions(self, tenant: str | None = None) -> list[tuple[str, Note]]:
        """(tenant, question) of every question still open, of one tenant or all, read from
        what is live only (never by scanning every run), oldest first."""

    # -- schedules (laneflow.domain.schedules) ------------------------------------------------

    @abstractmethod
    def create_schedule(self, schedule: Schedule) -> None:
        """Write a new schedule (its input masked). `Conflict` if its id is taken."""

    @abstractmethod
    def get_schedule(self, tenant: str, schedule_id: str) -> Schedule:
        """One schedule. `ScheduleNotFound` if absent (also when it is another tenant's)."""

    @abstractmethod
    def list_schedules(self, tenant: str) -> list[Schedule]:
        """The tenant's schedules, oldest first."""

    @abstractmethod
    def list_enabled_schedules(self, tenant: str | None = None) -> list[Schedule]:
        """The schedules not paused, of one tenant or all (what `serve` fires), read from
        what is live only, oldest first."""

    @abstractmethod
    def record_firing(self, tenant: str, schedule_id: str, firing: Firing, *, through: str | None = None) -> Schedule:
        """Record what one firing did, as `laneflow.domain.schedules.recorded` says (a firing
        recorded before stays as it was unless it has now started; the schedule's last run,
        what it holds and how far it was looked at follow), at once, conditional on the
        record it was decided on. A started firing's run is listed under the schedule
        (`list_schedule_runs`). Returns the schedule as written. `ScheduleNotFound`."""

    @abstractmethod
    def set_schedule_state(self, tenant: str, schedule_id: str, state: ScheduleState, *, at: str) -> Schedule:
        """Pause or resume a schedule at `at` (resumed, only firings after `at` are due).
        Returns it as written. `ScheduleNotFound`."""

    @abstractmethod
    def delete_schedule(self, tenant: str, schedule_id: str) -> Schedule:
        """Remove a schedule; what it was. The runs it started stay, listed under its id.
        `ScheduleNotFound`."""

    @abstractmethod
    def list_schedule_runs(
        self, tenant: str, schedule_id: str, *, limit: int = 50, before: str | None = None
    ) -> list[tuple[str, Run]]:
        """(scheduled time, run) of the runs the schedule's firings started, newest firing
        first, without steps; with `before` (a scheduled time), only older firings'. Runs no
        longer there are left out; a schedule that never started one has none."""

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:  # pragma: no cover - trivial default
        """Release connections (none, unless a store holds some)."""
        return None
