"""The ports: what the use cases work through, as interfaces. Adapters implement them
(laneflow.adapters), one wiring module builds them (laneflow.wiring), and a use case is
handed a `Services` holding them, never reaching for a global.

- `Store`: every durable fact about runs (conditional writes; two implementations).
- `Executor` / `ExecutionSink`: running one attempt of one step on a model.
- `StepInbox`: a step's colleagues and inbox (peers, ask), reached through its sink.
- `TaskCallbacks`: completing a state machine's callback tokens.
- `DriveStarter`: starting a new drive of a run.
- `DriveContinuer`: continuing a drive in a fresh execution (NextDrive).
- `CaptureSink`: keeping tool calls' input and output beside the run.
- `OnEnd`: told about every run that ends.
- `WorkspaceSource`: finding a workspace by name; `WorkspaceFolders`: a folder holding it.
- `SandboxTasks`: stopping the Fargate task a sandboxed step runs in.
- `SecretSource`: the values of an agent's declared secrets; `SecretFiles`: `@NAME` files.
- `WorkerLiveness`: whether the worker of an attempt or a drive is still there.
- `Telemetry`: log context and step metrics (Powertools in Lambda, nothing locally).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import SecretStr

from laneflow.domain.apis import ApiSpec
from laneflow.domain.errors import ModelNotConfigured
from laneflow.domain.gate import GatePass, GateWaiter
from laneflow.domain.inbox import Note, Peer
from laneflow.domain.messages import ExecutionInput
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    EventType,
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
from laneflow.domain.redaction import Redactor, redact_logs
from laneflow.domain.workers import FargateTask, WorkerRef
from laneflow.settings import Settings

log = logging.getLogger("laneflow.ports")


class CaptureSink(Protocol):
    def put(self, tenant: str, run_id: str, key: str, record: dict[str, Any]) -> str:
        """Store one capture; returns its reference (relative key)."""


class TokenGone(Exception):
    """The token names no task that is still waiting (completed, timed out, execution ended)."""


class TaskCallbacks(Protocol):
    def succeed(self, token: str, output: dict[str, Any]) -> None:
        """Complete the waiting task with `output`. Raises TokenGone if nothing waits on it."""

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        """Complete every waiting task of `tokens` with the same `output` (a lead releasing its
        lane's siblings), at once where the adapter can; the tokens nothing waited on."""

    def fail(self, token: str, error: str, cause: str) -> None:
        """Fail the waiting task with an error name the definition can catch."""

    def heartbeat(self, token: str) -> None:
        """The worker of the waiting task is alive (a task with `HeartbeatSeconds` that hears
        nothing for that long times out). Raises TokenGone if nothing waits on it."""


class DriveStarter(Protocol):
    def start(self, tenant: str, run_id: str) -> str:
        """Start a new drive of the run; returns the execution's id."""


class DriveContinuer(Protocol):
    def continue_drive(self, start: ExecutionInput, name: str) -> str:
        """Start the execution `name` that continues a drive (NextDrive), with `start` as its
        input; idempotent: an execution of that name already started is the one returned.
        Returns the execution's id."""


class OnEnd(Protocol):
    def __call__(self, run: Run) -> None: ...


class WorkspaceSource(Protocol):
    def locate(self, tenant: str, name: str) -> str:
        """The URI of the tenant's workspace called `name`; WorkspaceNotFound if there is none."""


@dataclass(frozen=True)
class StepJob:
    tenant: str
    run_id: str
    index: int
    attempt: int  # this attempt's number (1-based, counted across loop cycles)
    agent: str
    model: str
    item: Any
    run_input: Any
    system_stable: str  # the cached part of the system prompt
    system_dynamic: str  # what changes between runs, after the cache breakpoint
    user: str  # the instruction, the handoff block and what earlier attempts taught
    tools: tuple[str, ...] = ()
    workspace_root: str = ""  # where the step's file tools may reach (never sent to the model)
    agent_path: str = ""  # the agent's folder, relative to the workspace
    stub: str | list[str] | None = None
    answer_index: int = 0  # which stub answer: attempts at this step position so far
    max_turns: int | None = None
    timeout: float | None = None
    budget: float | None = None
    # What the step's programs (bash, scripts) get beyond the fixed variables: the declared
    # secrets, NAME -> value (for `@NAME`, the path of its 0600 file), under the names they
    # cross as (a model-named secret already renamed `LANEFLOW_DECLARED_<NAME>`).
    secret_env: dict[str, str] = field(default_factory=dict)
    effort: str | None = None  # agent `effort:`, sent the way the model takes it (or not, saying so)
    size: str | None = None  # agent `size:` (small, medium, large): the programs' limits
    network_enforce: bool = False  # AGENTS.md `network_enforce:`: refuse a sandbox without a network fence
    sandboxed: bool = False  # `Agent.sandboxed`: the step runs in a sandbox worker
    apis: tuple[ApiSpec, ...] = ()  # agent `apis:`: its `api_<name>` tools (headers unfilled)


@dataclass
class StepOutcome:
    result: str  # the whole reply (every turn's text)
    conclusion: str  # the final turn's text
    cost_usd: float = 0.0
    turns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class StepInbox(Protocol):
    """A step's colleagues and its inbox, as one attempt sees them (`tools: [peers]`,
    `tools: [ask]`). A refused message or question raises `NoteRefused`."""

    def peers(self) -> list[Peer]:
        """The other steps launched in this step's group."""

    def send(self, to: str, text: str) -> Note:
        """Send a colleague (an agent name or a step index) a message, delivered between its turns."""

    def take(self) -> list[Note]:
        """What this step has not yet been given (messages, answers to its questions), each
        recorded as observed by this attempt: given once per step, not once per attempt."""

    def ask(self, question: str) -> str:
        """Put a question to a person and wait (bounded) for the answer: the tool's result."""


class ExecutionSink(Protocol):
    """Where an executor reports. Every method is a fenced write about this attempt.
    `inbox` is the step's colleagues and inbox when its agent has `peers` or `ask`, else None."""

    inbox: StepInbox | None

    def first_event(self) -> None:
        """The model's response has begun (the stream's first event): opens the warm gate."""

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:
        """Before the first model call: the step's stable prefix (about `tokens`) is below
        its model's minimum cacheable length (`minimum`), so nothing of it will be cached
        and a lane's lead opens its gate now (its siblings have nothing to wait for)."""

    def begin_turn(self) -> None:
        """Before each model turn (the judge's too): raises `StepFailed` (not retryable,
        "budget spent ...") once the run's spend has reached the run's budget, so no running
        step begins another turn."""

    def call(self, span: ModelCall) -> ModelCall:
        """Record (or update, same id) a model-call span. The sink numbers it across the
        step's attempts and returns it as stored."""

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        """Append a trace line."""

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        """Record a tool call: a tool event and, unless capture is off, its input and output;
        `is_error`: the call failed and its output, sent to the model as an error, says why."""

    def stopped(self) -> bool:
        """True when the run was stopped: the executor ends the attempt as soon as it can."""


class Executor(Protocol):
    name: str

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome: ...


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
    def list_runs(self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None) -> list[Run]:
        """The tenant's runs, newest first, without steps."""

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

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:  # pragma: no cover - trivial default
        """Release connections (none, unless a store holds some)."""
        return None


class WorkingCopy(Protocol):
    """The folder one attempt reads and writes (`root`)."""

    root: Path

    def changed(self, agent_path: str) -> list[str]:
        """What the attempt created or changed in the folders that outlive it."""

    def keep(self, paths: list[str]) -> None:
        """Carry those files back to the workspace (the attempt completed)."""

    def discard(self) -> None:
        """Remove the copy (however the attempt ended)."""


class WorkspaceFolders(Protocol):
    def open(self, uri: str) -> Path:
        """A folder holding the workspace at `uri` (a local path, or an S3 prefix synced)."""

    def checkout(self, uri: str, agents: Collection[str] | None = None) -> WorkingCopy:
        """The attempt's own working copy of the workspace at `uri`; a scratch copy (a
        sandboxed attempt's) holds of `agents/` only the folders of `agents`."""


class SandboxTasks(Protocol):
    def stop(self, task: FargateTask, reason: str) -> None:
        """Stop a sandbox task (a person stopped its run): its worker is told to end."""


class SecretSource(Protocol):
    """Where declared secrets' values come from: locally a dotenv file or the environment,
    in the cloud Secrets Manager under `laneflow/<tenant>/<NAME>`."""

    def read(self, tenant: str, workspace_uri: str, names: list[str]) -> dict[str, str]:
        """The values of `names` that are set (a name not set is left out). A source that
        cannot be read raises `StepFailed` (retryable when it may work later: a throttle,
        the network) or `InvalidInput` (a dotenv file that does not parse), never with a
        value in its message."""

    def where(self, workspace_uri: str) -> str:
        """Where values are read from, in words fit for the trace (no path, no value)."""


class SecretFileSet(Protocol):
    paths: dict[str, str]  # name -> the file's absolute path

    def remove(self) -> None:
        """Remove every file and their folder (idempotent)."""


class SecretFiles(Protocol):
    def write(self, values: dict[str, str]) -> SecretFileSet:
        """Write each value (name -> value) to its own 0600 file in a fresh private folder
        outside any workspace; the caller removes them when the attempt ends."""


class WorkerLiveness(Protocol):
    def alive(self, worker: WorkerRef | None) -> bool | None:
        """Is that worker still there: True, False, or None (cannot tell)."""


class Telemetry(Protocol):
    metrics_on: bool

    def bind(self, **keys: Any) -> None:
        """Add keys (run, step, attempt) to every later log line of this invocation."""

    def step_metrics(self, *, cost_usd: float, duration_ms: float, calls: list[ModelCall], gate_wait_ms: float | None) -> None:
        """Emit one step's metrics."""


class NoTelemetry:
    """Telemetry where there is none (locally): binds nothing, emits nothing."""

    metrics_on = False

    def bind(self, **keys: Any) -> None:
        return None

    def step_metrics(self, *, cost_usd: float, duration_ms: float, calls: list[ModelCall], gate_wait_ms: float | None) -> None:
        return None


@dataclass
class Services:
    """The ports one process's use cases work through (built by `laneflow.wiring`)."""

    store: Store
    captures: CaptureSink
    settings: Settings
    callbacks: TaskCallbacks
    folders: WorkspaceFolders
    # Builds the executor a model needs, given the model's key (None for the stub); once per kind.
    make_executor: Callable[[str, str | None], Executor]
    # Reads the model's key from the secret store by the secret's name (where steps run).
    read_secret: Callable[[str], str]
    on_end: OnEnd | None = None  # told about every run that ends
    drives: DriveStarter | None = None  # starts a new drive of a run (API, reconcile in the cloud)
    continuations: DriveContinuer | None = None  # continues a drive in a fresh execution (NextDrive)
    workspaces: WorkspaceSource | None = None  # finds a workspace by name (API)
    tasks: SandboxTasks | None = None  # stops the Fargate tasks of sandboxed steps (cloud)
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    secrets: SecretSource | None = None  # declared secrets' values (None: a step declaring one fails)
    secret_files: SecretFiles | None = None  # where `@NAME` secrets are written for an attempt
    # The tool definitions a step's request carries (part of its cached prefix), as the
    # executors build them; None: counted as no tools (the prefix of the stable system alone).
    tool_definitions: Callable[[StepJob], list[dict[str, Any]]] | None = None
    # Set when this worker is going away (a local runner got SIGINT or SIGTERM): one-way. No
    # new attempt is claimed, running ones see it as a stop and are marked interrupted.
    leaving: threading.Event = field(default_factory=threading.Event)
    executors: dict[str, Executor] = field(default_factory=dict)
    # This process is a sandbox worker (laneflow.entrypoints.sandbox_worker): the only kind of
    # worker that may run a sandboxed agent's step, each attempt in a scratch copy.
    sandbox: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What must never be recorded is masked by the store (every write), its captures and
        # this process's log records, all from one redactor. A key already in the settings is
        # added now; one read from the secret store is added when it is read (`_model_key`),
        # which a step runner does before it records anything (`secret_values`).
        if self.settings.anthropic_api_key_set:
            self.redactor.add("ANTHROPIC_API_KEY", self.settings.anthropic_api_key.get_secret_value())  # type: ignore[union-attr]
        redact_logs(self.redactor)

    @property
    def redactor(self) -> Redactor:
        """The store's redactor: add a value to it and it is masked wherever it is recorded."""
        return self.store.redactor

    def check_model(self, model: str) -> None:
        """Refuse a model this deployment cannot call (`ModelNotConfigured`), without reading
        its key: a function that only starts or plans runs is never given the key."""
        if model == "stub":
            return
        if not self.settings.claude_configured:
            raise ModelNotConfigured(f"model {model!r} needs ANTHROPIC_API_KEY (or run with --model stub)")

    def executor(self, model: str) -> Executor:
        """The executor for a model: `stub`, else the Claude executor (one shared client),
        whose key is read the first time it is needed."""
        kind = "stub" if model == "stub" else "anthropic"
        with self._lock:
            if kind not in self.executors:
                key = None
                if kind == "anthropic":
                    self.check_model(model)
                    key = self._model_key()
                    if key is None:
                        raise ModelNotConfigured(f"model {model!r}: the model's key is read only where steps run, not here")
                self.executors[kind] = self.make_executor(model, key)
            return self.executors[kind]

    def _model_key(self) -> str | None:
        """The model's key: from the settings, else read from the secret store once and kept
        for the life of this process. Only the functions that run steps are given the
        secret's name (and the right to read it); the others never ask."""
        with self._lock:
            held = self._held_key()
            if held is not None:
                return held
            name = self.settings.anthropic_secret
            if not name:
                return None
            key = self.read_secret(name)
            self.settings = self.settings.model_copy(update={"anthropic_api_key": SecretStr(key)})
            self.redactor.add("ANTHROPIC_API_KEY", key)
            return key

    def secret_values(self) -> dict[str, str]:
        """Values that must never be recorded (replaced by their names wherever recorded).

        Where a step runs with the model's key in the secret store, this is what reads it
        first: what the step records is redacted from its first line, before the model is
        called. A key that cannot be read is not in memory, so it cannot leak; the model
        call that needs it fails with the reason."""
        try:
            key = self._model_key()
        except ModelNotConfigured as error:
            log.warning("%s", error)
            key = None
        return {"ANTHROPIC_API_KEY": key} if key else {}

    def held_secret_values(self) -> dict[str, str]:
        """`secret_values` without reading anything: the model's key only where this process
        holds it already. What masks a run's records where no step runs (the API, the
        planning handlers), which are never given the key and never ask for it."""
        with self._lock:
            held = self._held_key()
        return {"ANTHROPIC_API_KEY": held} if held is not None else {}

    def _held_key(self) -> str | None:
        """The model's key where this process holds it (given, or read once already)."""
        if not self.settings.anthropic_api_key_set:
            return None
        return self.settings.anthropic_api_key.get_secret_value()  # type: ignore[union-attr]
