"""The store interface: every durable fact about runs goes through it.

Two implementations keep one contract (tests/integration/test_store_contract.py runs the
same suite against each): `SqliteStore` (the embedded default) and, later, a DynamoDB one.

The language of the interface is conditional writes:
- Partial updates only. A save names the fields it changes; it can never put back a field
  it did not name (so a late save cannot undo `stop_requested`).
- `expect_status` makes a write conditional on the current status; a refused write raises
  `Conflict` and changes nothing.
- Every write about an attempt names its exact identity (`AttemptRef`). It lands only
  while the stored attempt has that identity and is still running; otherwise it raises
  `AttemptEnded` and changes nothing.
- A write is whole or absent: nothing half-written when it fails.
- Implementations are safe to call from many threads at once (the engine runs every Map
  iteration on its own thread) and from several processes (a second terminal's `stop`).
- Secrets are never written. `Store` masks every write's recorded text with its `redactor`
  before an implementation sees it (`REDACTED_WRITES`), so both stores, the S3 blobs of the
  DynamoDB one and any later write get it in this one place, not at each call site.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import Any

from ..capture import Redactor
from ..models import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    FailureKind,
    JournalEntry,
    ModelCall,
    PromptLayer,
    Run,
    RunStatus,
    Step,
    StepStatus,
)

# Fields of a run that `update_run` may change. `stop_requested` is not among them: only
# `request_stop` sets it, and nothing clears it.
RUN_FIELDS = frozenset(
    {
        "status",
        "driven_at",
        "finished_at",
        "parked_at",
        "revision",
        "cost_usd",
        "drives",
        "error",
        "execution",
        "driver",
        "options",
    }
)

# Fields of a step that `update_step` and `end_attempt(step=...)` may change.
STEP_FIELDS = frozenset(
    {
        "status",
        "attempts",
        "cycle",
        "instruction",
        "message",
        "result",
        "conclusion",
        "data",
        "skip_reason",
        "error",
        "cost_usd",
        "model",
        "started_at",
        "finished_at",
    }
)


# Each write, and the arguments of it that carry recorded text (results, instructions,
# messages, reasons, events, spans, handoffs, inputs...): masked before it is written.
REDACTED_WRITES: dict[str, tuple[str, ...]] = {
    "create_run": ("run",),
    "update_run": ("changes",),
    "add_steps": ("steps",),
    "update_step": ("changes",),
    "claim_attempt": ("worker", "message"),
    "end_attempt": ("reason", "step", "calls"),
    "set_attempt_worker": ("worker",),
    "add_event": ("event",),
    "put_call": ("call",),
    "put_handoff": ("text",),
}
# Writes that carry only keys, identities, times, statuses and hashes: nothing to mask.
UNMASKED_WRITES = frozenset(
    {"request_stop", "heartbeat", "journal_begin", "journal_settle", "set_prompt_layers", "gate_wait", "gate_open"}
)


def _masking(method: Callable[..., Any], arguments: tuple[str, ...]) -> Callable[..., Any]:
    """`method` with the named arguments masked by the store's redactor first."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def write(self: "Store", *args: Any, **kwargs: Any) -> Any:
        redactor = self.redactor
        if not redactor:  # nothing to mask: no cost on the write path
            return method(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        for name in arguments:
            if name in bound.arguments:
                bound.arguments[name] = redactor.value(bound.arguments[name])
        return method(*bound.args, **bound.kwargs)

    write.__masks__ = arguments  # type: ignore[attr-defined]
    return write


class Store(ABC):
    """Runs, steps, attempts, events, spans and prompt layers, keyed by tenant first."""

    url: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every implementation's writes are masked, whatever it is and whoever adds it.
        for name, arguments in REDACTED_WRITES.items():
            method = cls.__dict__.get(name)
            if method is not None and not hasattr(method, "__masks__"):
                setattr(cls, name, _masking(method, arguments))

    @property
    def redactor(self) -> Redactor:
        """What this store masks in everything it writes: `store.redactor.add(NAME, value)`
        and from then on `value` is written as `[NAME]`. The services add the model's key."""
        found = self.__dict__.get("_redactor")
        if found is None:
            found = self.__dict__.setdefault("_redactor", Redactor())
        return found

    # -- runs ---------------------------------------------------------------------------

    @abstractmethod
    def create_run(self, run: Run) -> None:
        """Write a new run with all of its steps, at once. `Conflict` if the id exists."""

    @abstractmethod
    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True) -> Run:
        """The run with its steps ordered by index. With `detail`, each step carries its
        events (in order), calls (by `n`) and prompt layers. With `steps=False`, the run
        alone (its `steps` empty): the cheap read a handler makes. `RunNotFound` if absent
        (also when it belongs to another tenant)."""

    @abstractmethod
    def list_runs(self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None) -> list[Run]:
        """The tenant's runs, newest first, without steps."""

    @abstractmethod
    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: dict[str, Any],
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_cost: float = 0.0,
        add_drives: int = 0,
    ) -> Run:
        """Change the named fields (a subset of RUN_FIELDS), add to cost and drives, all at
        once, only if the status is one of `expect_status` (when given). Returns the run
        as written (without steps). `Conflict` when refused, `RunNotFound` when absent."""

    @abstractmethod
    def request_stop(self, tenant: str, run_id: str) -> bool:
        """Set `stop_requested`. True if this call set it, False if it was already set."""

    # -- steps --------------------------------------------------------------------------

    @abstractmethod
    def get_steps(self, tenant: str, run_id: str, *, group: int | None = None) -> list[Step]:
        """Steps ordered by index (without events, calls or layers), of one group if given."""

    @abstractmethod
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        """One step; with `detail`, its events, calls and prompt layers. `NotFound` if absent."""

    @abstractmethod
    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        """Append new step records (rescue records). `Conflict` if an index is taken."""

    @abstractmethod
    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: dict[str, Any],
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        """Change the named fields (a subset of STEP_FIELDS) of a step not scoped to an
        attempt (planning, skipping, loop resets). `Conflict` when the status is not one of
        `expect_status`."""

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
        resumed_at: str | None = None,
        expect_status: Collection[StepStatus] = (StepStatus.pending,),
        journal_ttl_s: int = 7 * 24 * 3600,
        worker: str | None = None,
        layers: list[PromptLayer] | None = None,
        message: str | None = None,
    ) -> Attempt:
        """Claim the next attempt of a step, at once: a new attempt `n = step.attempts + 1`
        (running), the step `running` with `attempts = n` and `started_at` set on its first
        attempt. Only if the step's status is one of `expect_status` and it has no running
        attempt; otherwise `Conflict`.

        With `op_id`, the claim and its journal entry are written together: the entry (made
        here if `journal_begin` did not) becomes `completed` with the attempt's identity. If
        the journal already holds a `completed` entry for `op_id`, nothing is claimed: the
        attempt that entry names is returned (a re-delivered invocation gets what the first
        one got, whatever the step's status now). An entry `cancelled` is a `Conflict`.

        `worker` and `layers`, when given, are written with the claim (as `set_attempt_worker`
        and `set_prompt_layers` would, but in the same write), and so is `message`: the
        step's `message` becomes the user message this attempt is sent (kept as it was
        when None). A large message goes where the store keeps large values."""

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
        step: dict[str, Any] | None = None,
        run_cost: float = 0.0,
        calls: list[ModelCall] | None = None,
        reason_kind: FailureKind | None = None,
    ) -> None:
        """End a running attempt (with its `reason` and, for a failure, its `reason_kind`),
        and in the same write change its step (`step`, a subset of STEP_FIELDS), add
        `run_cost` to the run's cost and record `calls` (spans, inserted or replaced by id, as
        `put_call` would). Fenced: `AttemptEnded` unless the stored attempt has exactly
        `ref`'s identity and is running."""

    @abstractmethod
    def set_attempt_worker(self, ref: AttemptRef, worker: str) -> None:
        """Record what is working on the attempt (a Lambda request, a task ARN, a pid).
        Fenced like `end_attempt`."""

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
    def journal_get(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        """The journal entry of an operation, or None."""

    @abstractmethod
    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        """Entries still `pending` (a crash came between asking for a claim and getting it),
        read from what is active only."""

    @abstractmethod
    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        """Settle a `pending` entry: `completed` with the attempt if a claim with this
        `op_id` landed, else `cancelled`. An entry already settled is returned as it is."""

    # -- active runs ----------------------------------------------------------------------

    @abstractmethod
    def active_runs(self, tenant: str | None = None) -> list[Run]:
        """Runs `queued`, `running` or `awaiting-approval` (without steps), of one tenant or
        all, read from a sparse index of what is active: the cost grows with active runs,
        not with all runs."""

    # -- trace --------------------------------------------------------------------------

    @abstractmethod
    def add_event(
        self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None
    ) -> None:
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
    def gate_wait(self, tenant: str, run_id: str, key: str, token: str) -> bool:
        """A sibling arrives at its lane's gate with its callback token. At once: if the gate
        is open, return True (the caller completes its own token); otherwise keep the token
        for the lead and return False. Together with `gate_open` this is a rendezvous:
        whichever arrives second completes the token, so no sibling waits forever."""

    @abstractmethod
    def gate_open(self, tenant: str, run_id: str, key: str) -> list[str]:
        """Open the gate (idempotent) and hand back, at once, the tokens kept so far; a token
        is handed back only once. A second call returns []."""

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:  # pragma: no cover - trivial default
        """Release connections."""
