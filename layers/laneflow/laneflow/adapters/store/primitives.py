"""What a store backend implements for the rule book: its primitives, and what they exchange.

Each primitive is one read, or one conditional write that lands whole or raises `Refused`
having written nothing. None decides what the rules decide (laneflow.adapters.store.rulebook
has the rules they serve).

Primitives (`seen`, where taken, is the `StepState` the decision was made on; a backend
may keep what it needs for its conditions in `StepState.seen`; the warm gate's two are the
rendezvous itself, a few conditional requests each on DynamoDB, where a transaction per
sibling cost several times as much). 36 primitives:

| primitive            | kind  | what                                                    |
|----------------------|-------|---------------------------------------------------------|
| `_read_run`          | read  | a run (its steps, their trace), its head, its input     |
|                      |       | alone or its key alone (whether it is there), or None   |
| `_read_steps`        | read  | steps of a run: all, one index, or one group            |
| `_read_outline`      | read  | a run's group outline (counts by group)                 |
| `_read_attempts`     | read  | attempts of a run, of a step, or one                    |
| `_read_step_state`   | read  | what a claim or a journal write decides on              |
| `_list_runs`         | read  | a tenant's runs, newest first                           |
| `_active_runs`       | read  | runs not ended, from what is live only                  |
| `_running_attempts`  | read  | attempts running, from what is live only                |
| `_pending_entries`   | read  | journal entries pending, from what is live only         |
| `_read_handoff`      | read  | a handoff block, or None                                |
| `_insert_run`        | write | a new run with its steps, if its id is free             |
| `_insert_steps`      | write | steps of a run, if their indexes are free               |
| `_update_run`        | write | a run's fields, if its status is expected (and, when    |
|                      |       | named, a flag is not set: `stop_requested`)             |
| `_add_run_cost`      | write | an amount added to a run's cost, if it is active        |
| `_update_step`       | write | a step's fields, if its status is expected              |
| `_write_claim`       | write | a new attempt (and its journal entry), if `seen` holds  |
| `_write_entry`       | write | a journal entry begun or settled, if `seen` holds       |
| `_write_attempt`     | write | fenced: an attempt's ending, heartbeat, spans, layers   |
| `_append`            | write | a trace line (fenced when an attempt is named), or the  |
|                      |       | ids an attempt observed (fenced)                        |
| `_write_handoff`     | write | a handoff block                                         |
| `_gate_wait`         | write | the warm gate's rendezvous, a sibling's side            |
| `_gate_open`         | write | the warm gate's rendezvous, the lead's side             |
| `_gate_claim`        | write | a gate made by whoever comes first, else its state      |
| `_read_prefix`       | read  | a tenant's prefix record, or None                       |
| `_write_prefix`      | write | a prefix record, if its version is still the one read   |
| `_writing_prefixes`  | read  | prefix records an attempt holds the claim of            |
| `_read_notes`        | read  | every note of a run's inboxes, or one                   |
| `_read_observed`     | read  | what each attempt of a step observed                    |
| `_open_questions`    | read  | questions open, from what is live only                  |
| `_write_note`        | write | a note, if its id is free, or a question answered or    |
|                      |       | expired, if it is still open                            |
| `_read_schedule`     | read  | a schedule's record, or None                            |
| `_schedule_docs`     | read  | a tenant's schedules, or those enabled (live only)      |
| `_write_schedule`    | write | a schedule's record, if its version is the one read     |
|                      |       | (or, new, if its id is free)                            |
| `_delete_schedule`   | write | a schedule, if its version is the one read              |
| `_put_schedule_run`  | write | the run a schedule's firing started, under the schedule |
| `_schedule_runs`     | read  | the runs a schedule's firings started, newest first     |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from laneflow.domain.errors import RecordDamaged
from laneflow.domain.gate import GateClaim, GatePass, GateWaiter
from laneflow.domain.inbox import Note
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.prefixes import PrefixRecord
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
    Step,
)
from laneflow.domain.schedules import Schedule

Doc = str | dict[str, Any]  # a record as a backend read it: its JSON text, or its fields

RunPart = Literal["whole", "head", "input", "key"]  # what `_read_run` reads of a run


# -- what the primitives exchange ----------------------------------------------------------


class Refused(Exception):
    """A primitive's condition did not hold: it wrote nothing. `found` is what it saw
    instead (each primitive says what)."""

    def __init__(self, found: Any = None):
        super().__init__(found)
        self.found = found


@dataclass(frozen=True)
class StepState:
    """What a claim or a journal write decides on, as one read of a step found it."""

    index: int
    status: str
    attempts: int
    last_n: int  # the highest attempt number ever claimed (0: none)
    running: int | None  # the running attempt's number
    entry: JournalEntry | None = None  # the op_id's entry (completed: with its attempt's identity)
    landed: Attempt | None = None  # the first attempt claimed with the op_id, if the step holds it
    seen: Any = field(default=None, compare=False)  # the backend's own record of what it read


@dataclass(frozen=True)
class Fenced:
    """What a refused fenced write found: the stored attempt of the ref's number (None if the
    store holds none where it looked) and the highest attempt number of its step."""

    attempt: Attempt | None
    last_n: int = 0


@dataclass
class AttemptWrite:
    """One fenced write about a running attempt: any of ending it (`status`, with its
    reason), its step's changes, spans (inserted or replaced by id), the step's prompt
    layers, a heartbeat."""

    status: AttemptStatus | None = None
    ended_at: str | None = None
    reason: str | None = None
    reason_kind: FailureKind | None = None
    step: dict[str, Any] = field(default_factory=dict)
    calls: list[ModelCall] = field(default_factory=list)
    layers: list[PromptLayer] | None = None
    heartbeat_at: str | None = None


@dataclass(frozen=True)
class Claim:
    """A claim as it is to be written: the new attempt (running), the prompt layers and
    message written with it, and the op_id's journal entry completed with it (None without
    an op_id). `created` says whether the claim makes the entry (no `journal_begin` came)."""

    attempt: Attempt
    layers: list[PromptLayer] | None = None
    message: str | None = None
    entry: JournalEntry | None = None
    created: bool = False


class Primitives(ABC):
    """The reads and conditional writes a backend implements (`seen`, where taken, is the
    `StepState` a decision was made on)."""

    @abstractmethod
    def _read_run(
        self, tenant: str, run_id: str, *, steps: bool = False, detail: bool = False, part: RunPart = "whole"
    ) -> Doc | None:
        """The run (None if absent): `whole`; its `head` (all but its input, which is not
        read); its `input` alone (`{"input": ...}`); or only its `key` (`{}`: whether it is
        there, reading nothing else). With `steps` (whole or head), its steps by index; with
        `detail`, each with its events (in order), calls (by n, then id) and prompt layers.
        `RecordDamaged` (`damaged`, `trace_damaged`) when what was read does not parse."""

    @abstractmethod
    def _read_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        index: int | None = None,
        group: int | None = None,
        detail: bool = False,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[tuple[int, Doc]]:
        """(index, step) of a run's steps, by index: all, the one `index`, or those of
        `group`, and of those only what `where` admits; with `detail`, as `_read_run`;
        without `messages`, no step's `message`. [] when there are none (or no run)."""

    @abstractmethod
    def _read_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        """The run's group outline, by group: counted in the store where it can, else
        `outline_of` the few small fields of each step it counts (`StepFacts`, not the
        steps). [] when there are no steps (or no run)."""

    @abstractmethod
    def _read_attempts(self, tenant: str, run_id: str, *, index: int | None = None, n: int | None = None) -> list[Attempt] | None:
        """The attempts of a run, of step `index`, or attempt `n` of step `index`, in any
        order. [] when there are none; None when there is no run (a backend may say [] for a
        missing run when `n` is given: that is `NotFound` either way)."""

    @abstractmethod
    def _read_step_state(self, tenant: str, run_id: str, index: int | None, op_id: str | None) -> StepState | None:
        """What claims and journal writes decide on, of step `index` - or, with index None,
        of the step holding `op_id`'s journal entry - with `op_id`'s entry when given. None
        if there is no such step."""

    @abstractmethod
    def _list_runs(
        self, tenant: str, limit: int, statuses: list[str] | None, before: str | None = None
    ) -> list[tuple[str, Doc | RecordDamaged]] | None:
        """(run id, run without steps) of the tenant's runs, newest first (the later of two
        created in the same millisecond first), at most `limit`, of `statuses` if given,
        after run `before` in that order if given (None when `before` is not a run of the
        tenant); a run that cannot be read is its `RecordDamaged`."""

    @abstractmethod
    def _active_runs(self, tenant: str | None) -> list[tuple[str, Doc | RecordDamaged]]:
        """As `_list_runs`, of the runs whose status is one of ACTIVE (of one tenant or all),
        oldest first, read from what is live only."""

    @abstractmethod
    def _running_attempts(self, tenant: str | None) -> list[tuple[str, Attempt]]:
        """(tenant, attempt) of the attempts running, read from what is live only."""

    @abstractmethod
    def _pending_entries(self, tenant: str | None) -> list[JournalEntry]:
        """The journal entries pending, read from what is live only."""

    @abstractmethod
    def _read_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        """The handoff block under `key`, or None."""

    @abstractmethod
    def _insert_run(self, run: Run) -> None:
        """Write the run with its steps (and whatever trace they carry). `Refused` if its id
        is taken."""

    @abstractmethod
    def _insert_steps(self, tenant: str, run_id: str, steps: list[Step]) -> bool:
        """Write new steps of a run, all or none. False (nothing written) if there is no
        run; `Refused` if one of their indexes is taken."""

    @abstractmethod
    def _update_run(
        self,
        tenant: str,
        run_id: str,
        values: dict[str, Any],
        *,
        expected: list[str] | None,
        add_drives: int = 0,
        unset: str | None = None,
    ) -> Doc:
        """Set `values` (field -> value, validated) and add `add_drives`, if the run's status
        is one of `expected` (when given) and its boolean field `unset` (when named) is not
        set. The run as written, without steps. `Refused` with the status found, or None if
        there is no run."""

    @abstractmethod
    def _add_run_cost(self, tenant: str, run_id: str, usd: float, *, expected: list[str]) -> float:
        """Add `usd` to the run's `cost_usd` (rounded as costs are stored), in one atomic
        increment, if its status is one of `expected`. The cost as written. `Refused` with
        the status found, or None if there is no run."""

    @abstractmethod
    def _update_step(self, tenant: str, run_id: str, index: int, values: dict[str, Any], *, expected: list[str] | None) -> Doc:
        """Set `values` of a step, if its status is one of `expected` (when given). The step
        as written (no trace). `Refused` with the status found, or None if no such step."""

    @abstractmethod
    def _write_claim(self, tenant: str, run_id: str, claim: Claim, seen: StepState) -> None:
        """Write the claim at once: its attempt, the step `running` with `attempts = n`
        (`started_at` set if unset, `message` set when given), its layers when given, its
        journal entry when given. Only if the step is still as `seen` (status, attempts,
        highest attempt number, none running, the entry as it was); else `Refused`."""

    @abstractmethod
    def _write_entry(self, entry: JournalEntry, seen: StepState | None) -> None:
        """Write a journal entry. Pending: begun, only if the op_id has no entry on a step
        that is there (and, when `seen` is given, the step is as seen). Settled: only if
        the entry is still pending as `seen` found it. Else `Refused`."""

    @abstractmethod
    def _write_attempt(self, ref: AttemptRef, write: AttemptWrite) -> None:
        """Write `write` only while the stored attempt `ref.n` has exactly `ref`'s identity
        (token, started_at, resumed_at: None compared as None) and is running; else `Refused`
        with a `Fenced`. Ending it, the attempt leaves what is live with its step (unless
        the step has a journal entry pending)."""

    @abstractmethod
    def _append(self, tenant: str, run_id: str, index: int, line: Event | list[str], fence: AttemptRef | None) -> None:
        """Append to a step, after everything appended before it: a trace line (an `Event`),
        or the ids attempt `fence.n` observed (a list, always with `fence`). With `fence`,
        only while that attempt is the stored, running one (as `_write_attempt`); else
        `Refused` with a `Fenced`."""

    @abstractmethod
    def _write_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        """Keep `text` under `key`, replacing what was there."""

    @abstractmethod
    def _gate_wait(self, tenant: str, run_id: str, key: str, waiter: GateWaiter) -> GatePass | None:
        """The sibling's side of the rendezvous: a pass if the gate is open for it (opened;
        for a reserve, `until_lead_ends`, the lead ended); else keep the waiter and return
        None - unless the gate opened for it meanwhile and the lead has not taken the
        waiter, then take it back and return a pass. Exactly one side hands a token back."""

    @abstractmethod
    def _gate_open(self, tenant: str, run_id: str, key: str, *, lead_ended: bool, note: str | None) -> list[GateWaiter]:
        """The lead's side: open the gate (idempotent; with `lead_ended`, mark the lead
        ended too), keep `note` if none is kept yet, and take every waiter kept so far that
        this opening releases (a reserve only with `lead_ended`), each only once (a waiter
        a sibling took back is not handed)."""

    @abstractmethod
    def _gate_claim(self, tenant: str, run_id: str, key: str) -> GateClaim:
        """Make the gate `key` if there is none ("lead"); else "open" if it was opened (or
        its lead ended), "wait" if not. Keeps nothing for a caller that waits."""

    # -- the prefix registry ----------------------------------------------------------------

    @abstractmethod
    def _read_prefix(self, tenant: str, key: str) -> PrefixRecord | None:
        """The record of prefix `key` (strongly consistent), or None."""

    @abstractmethod
    def _write_prefix(self, tenant: str, record: PrefixRecord, *, expected: int | None) -> None:
        """Write `record` whole if the stored one's version is `expected` (None: if there is
        none), else `Refused`. A record with a writer is live (`_writing_prefixes` finds it)."""

    @abstractmethod
    def _writing_prefixes(self, tenant: str | None) -> list[tuple[str, PrefixRecord]]:
        """(tenant, record) of the records with a writer, of one tenant or all, from what is live only."""

    # -- inboxes (peers, ask) ----------------------------------------------------------------

    @abstractmethod
    def _read_notes(self, tenant: str, run_id: str, note_id: str | None = None) -> list[Note]:
        """Every note of the run's inboxes, in any order, or the one `note_id` ([] for none,
        or no run)."""

    @abstractmethod
    def _read_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        """Attempt number -> the ids it observed, in the order observed."""

    @abstractmethod
    def _open_questions(self, tenant: str | None) -> list[tuple[str, Note]]:
        """(tenant, question) of the questions open, of one tenant or all, from what is live only."""

    # -- schedules --------------------------------------------------------------------------

    @abstractmethod
    def _read_schedule(self, tenant: str, schedule_id: str) -> str | None:
        """A schedule's record as the JSON it was written as (strongly consistent), or None."""

    @abstractmethod
    def _schedule_docs(self, tenant: str | None, *, enabled_only: bool) -> list[tuple[str, str]]:
        """(schedule id, record JSON) of one tenant's schedules, or of those enabled (of one
        tenant or all: from what is live only), in any order."""

    @abstractmethod
    def _write_schedule(self, schedule: Schedule, *, expected: int | None) -> None:
        """Write `schedule` whole if the stored one's version is `expected` (None: if there is
        none), else `Refused`. An enabled schedule is live (`_schedule_docs` finds it)."""

    @abstractmethod
    def _delete_schedule(self, tenant: str, schedule_id: str, *, expected: int) -> None:
        """Remove the schedule if its stored version is `expected`, else `Refused`."""

    @abstractmethod
    def _put_schedule_run(self, tenant: str, schedule_id: str, scheduled_at: str, run_id: str) -> None:
        """Keep that the firing at `scheduled_at` started `run_id` (the same again: nothing new)."""

    @abstractmethod
    def _schedule_runs(self, tenant: str, schedule_id: str, limit: int, before: str | None) -> list[tuple[str, str]]:
        """(scheduled time, run id) of the schedule's started firings, newest first, at most
        `limit`, only those before `before` when given."""

    @abstractmethod
    def _write_note(self, tenant: str, note: Note, *, replaces_open: bool) -> None:
        """Write a new note, `Refused` if its id is taken in the run; or, `replaces_open`,
        replace the stored question with `note` (answered or expired) only if the stored one
        is still open, else `Refused` with the note found (None if there is none). A
        question that is no longer open leaves what is live."""
