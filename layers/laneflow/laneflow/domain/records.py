"""The records laneflow keeps: runs, steps, attempts, events, model-call spans, prompt layers.

Field names are a contract (fields may be added, never renamed): `Run.public()` is what `--json` and the
API show. Internal fields (the workspace location, the parsed flow the run was started
with) are kept on the record but left out of the public shape.
"""

from __future__ import annotations

import datetime as _dt
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from laneflow.domain.workers import WorkerRef, stored


def utcnow() -> str:
    """Now, as an ISO-8601 UTC string with milliseconds (the format of every stored time)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    awaiting_approval = "awaiting-approval"
    completed = "completed"
    failed = "failed"

    @property
    def ended(self) -> bool:
        return self in (RunStatus.completed, RunStatus.failed)


class StepStatus(StrEnum):
    pending = "pending"
    running = "running"
    completed = "completed"
    failed = "failed"
    skipped = "skipped"
    awaiting_approval = "awaiting-approval"

    @property
    def ended(self) -> bool:
        return self in (StepStatus.completed, StepStatus.failed, StepStatus.skipped)


class AttemptStatus(StrEnum):
    running = "running"
    completed = "completed"
    failed = "failed"
    interrupted = "interrupted"
    stopped = "stopped"


class FailureKind(StrEnum):
    """Why a failed attempt failed, kept with it so the next attempt is told the truth."""

    output = "output"  # its own output was refused: not JSON, not its schema, the judge's verdict
    model = "model"  # a model or network error (the API kept failing, a stub `fail:`)
    worker = "worker"  # its worker failed under it (a crash, a Lambda timeout)
    memory = "memory"  # killed for memory, or its sandbox task evicted: the next attempt runs one size up (sizes.py)
    other = "other"  # anything else: its budget, time limit or turns, a setting, a bug


# How records are read from the JSON a store keeps (`model_validate_json`, and the config of
# any TypeAdapter that reads lists of them). pydantic-core keeps, by default, every string of
# up to 64 characters it ever read from JSON in one process-wide cache of 16,384: ids, times,
# items and outputs are read once each, so a long-lived process (`laneflow serve`) filled it
# run after run (~1.2 MB, none of it read again). Field names repeat: only they are kept.
READ_JSON = ConfigDict(cache_strings="keys")


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, use_enum_values=False, **READ_JSON)


# A worker reference on a record: read from the text a store keeps, too (`workers.loads`).
StoredWorker = Annotated[WorkerRef | None, BeforeValidator(stored)]


class EventType(StrEnum):
    """What a line of a step's trace is about. The values are what the store keeps (and what
    every earlier version wrote), so a stored line reads back as its member."""

    info = "info"  # something that happened: approved, rescued, looped, kept files
    attempt = "attempt"  # a later attempt started, with what it was told
    tool = "tool"  # a tool call of the agent
    gate = "gate"  # the prompt-cache gate: a sibling waits, the lead releases
    judge = "judge"  # the judge's verdict on the attempt's output
    warning = "warning"  # worth knowing, not a failure: a retry of a busy API, a capture limit
    error = "error"  # an attempt or the step failed, was rejected or did not run
    peer = "peer"  # a message between colleagues of a group (peers): sent, received, delivered
    ask = "ask"  # a question to a person (ask), its answer, or no answer in time


class Event(Record):
    """One line of a step's trace."""

    t: str = Field(default_factory=utcnow)
    type: EventType = EventType.info
    text: str
    attempt: int | None = None
    data: dict[str, Any] | None = None


class Tokens(Record):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0  # the part of `cache_write` written with the 1-hour TTL (the rest: 5 minutes)


class ModelCall(Record):
    """A model-call span: one model turn. The same `id` reported again updates the span."""

    id: str
    n: int = 1  # numbered across the step's attempts
    at: str = Field(default_factory=utcnow)
    ms: int = 0
    ttft_ms: int | None = None
    sent_ms: int | None = None  # from `at` until its request was written whole (the transport's own trace)
    model: str = "stub"
    tokens: Tokens = Field(default_factory=Tokens)
    tools: int = 0
    stop: str | None = None
    attempt: int | None = None  # set when it is not the first attempt
    cost_usd: float = 0.0
    delegate: str | None = None  # the delegate whose turn it was (agent.md `delegates:`), if not the step's own agent


class PromptLayer(Record):
    name: str
    chars: int
    sha256: str  # a prefix of the hex digest of the layer's text
    dynamic: bool = False


class Attempt(Record):
    """One try at a step. Its identity (run, index, n, token, started_at, resumed_at) fences
    every write about it: a write naming another identity changes nothing."""

    run_id: str
    index: int
    n: int
    token: str
    started_at: str
    resumed_at: str | None = None
    status: AttemptStatus = AttemptStatus.running
    ended_at: str | None = None
    reason: str | None = None
    reason_kind: FailureKind | None = None  # set on a failed attempt (an interruption's status says it)
    worker: StoredWorker = None  # what works on it: a process, a Lambda request, a task
    heartbeat_at: str | None = None
    op_id: str | None = None


class AttemptRef(Record):
    """The exact identity a write names: it lands only while the stored attempt still has it."""

    tenant: str
    run_id: str
    index: int
    n: int
    token: str
    started_at: str
    resumed_at: str | None = None

    @classmethod
    def of(cls, tenant: str, attempt: Attempt) -> AttemptRef:
        return cls(
            tenant=tenant,
            run_id=attempt.run_id,
            index=attempt.index,
            n=attempt.n,
            token=attempt.token,
            started_at=attempt.started_at,
            resumed_at=attempt.resumed_at,
        )


class JournalStatus(StrEnum):
    pending = "pending"  # the claim was asked for; whether it landed is not yet known
    completed = "completed"  # the claim landed: `attempt` is what it got
    cancelled = "cancelled"  # the claim never landed (settled after a crash)


class JournalEntry(Record):
    """One claim of the claim journal, keyed by the operation id the orchestrator's context
    gives (execution, state, map index, retry count): a re-delivered invocation presents the
    same id and gets what the first one got."""

    tenant: str
    run_id: str
    op_id: str
    index: int
    status: JournalStatus = JournalStatus.pending
    attempt: int | None = None  # the attempt number the claim got (completed)
    token: str | None = None
    started_at: str | None = None
    resumed_at: str | None = None
    created_at: str = Field(default_factory=utcnow)
    expires_at: int = 0  # epoch seconds (a DynamoDB TTL)


class Step(Record):
    index: int
    group: int
    entry: int = 0  # which entry of the flow's `steps:` list this step comes from
    slot: int = 0  # which step of that entry (a `group:` entry has several)
    agent: str | None = None
    item: Any = None
    model: str = "stub"
    status: StepStatus = StepStatus.pending
    attempts: int = 0
    cycle: int = 0
    instruction: str = ""
    message: str | None = None  # the user message its latest attempt was sent (masked like every record)
    result: str | None = None
    conclusion: str | None = None
    data: Any = None
    rescue_of: int | None = None
    skip_reason: str | None = None
    error: str | None = None
    optional: bool = False
    cost_usd: float = 0.0
    started_at: str | None = None
    finished_at: str | None = None
    # Why this step wrote a prompt prefix an earlier step of its agent had written (null: it
    # did not, or none had): {"layer": NAME|"tools"|"model"|"expired"|"below-minimum",
    # "since": "<run id>/<step index>"} (laneflow.domain.lanes_report).
    cache_break: dict[str, str] | None = None
    # Its cached prefix as its latest attempt sent it: {"tokens": N, "tools": "<digest>"}.
    prefix: dict[str, Any] | None = None
    # The TTL its cache writes asked for ("5m" | "1h") and why (laneflow.domain.cache_ttl).
    cache_ttl: str | None = None
    cache_ttl_reason: str | None = None
    # What its cache reads saved against plain input, less what its writes cost beyond it (USD).
    savings_usd: float = 0.0
    events: list[Event] = Field(default_factory=list)
    calls: list[ModelCall] = Field(default_factory=list)
    prompt_layers: list[PromptLayer] = Field(default_factory=list)


class Run(Record):
    id: str
    tenant: str = "local"
    workspace: str
    flow: str
    status: RunStatus = RunStatus.queued
    input: Any = Field(default_factory=dict)
    stop_requested: bool = False
    created_at: str = Field(default_factory=utcnow)
    driven_at: str | None = None
    finished_at: str | None = None
    parked_at: str | None = None
    revision: str | None = None
    cost_usd: float = 0.0
    savings_usd: float = 0.0  # what the prompt cache saved, the sum of its steps' (USD)
    drives: int = 0
    # Continuations: how many times a drive went on in a fresh execution because its history
    # budget was spent (NextDrive). Not drives: `drives` counts the first drive and re-drives.
    segments: int = 0
    # How many times a person redrove it after it failed (`laneflow redrive`): each time its
    # failed and skipped steps got a new attempt, its completed ones kept (usecases/redrive.py).
    redrives: int = 0
    error: str | None = None
    model: str | None = None  # a run-wide model override (`--model`)
    options: dict[str, Any] = Field(default_factory=dict)
    execution: str | None = None  # the current drive's execution id
    driver: StoredWorker = None  # what drives it now: a local process, or an execution in the cloud
    steps: list[Step] = Field(default_factory=list)
    # Internal: where the workspace is, and the flow as parsed when the run started.
    workspace_uri: str = Field(default="", exclude=True)
    flow_spec: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def then_run(self) -> str | None:
        """The run its flow's `then:` started when it completed (kept in `options`)."""
        found = self.options.get("then_run")
        return found if isinstance(found, str) else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def schedule_id(self) -> str | None:
        """The schedule whose firing started it (kept in `options`; laneflow.domain.schedules)."""
        found = self.options.get("schedule_id")
        return found if isinstance(found, str) else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def scheduled_at(self) -> str | None:
        """That firing's scheduled time, UTC (kept in `options`)."""
        found = self.options.get("scheduled_at")
        return found if isinstance(found, str) else None

    def public(self) -> dict[str, Any]:
        """The run record as `--json` and the API show it (snake_case), with its `lanes`
        (what the prompt cache did per lane, derived from the steps)."""
        from laneflow.domain.lanes_report import lane_rows  # it reads these records

        record = self.model_dump(mode="json")
        record["lanes"] = lane_rows(self.steps)
        return record

    def step(self, index: int) -> Step:
        for s in self.steps:
            if s.index == index:
                return s
        raise KeyError(index)


# The default of a change-set field that may not be None: None all the same, since unset it
# changes nothing and `Changes.changed()` leaves it out. Pydantic's typing cannot say "defaults
# to None, refuses None", so this one default is typed Any (given, None is still refused).
_UNSET: Any = None


class Changes(BaseModel):
    """A change set: the fields given are what changes (`model_fields_set`); the others are
    left as stored. A field that cannot be changed this way, or a value of the wrong type,
    is refused when the change set is made, before anything is written. (Fields that may
    not be None default to it all the same: unset, they change nothing.)"""

    model_config = ConfigDict(extra="forbid")

    def changed(self) -> dict[str, Any]:
        """The fields that change, with their new values (in the order the fields are declared,
        so a store writes them in the same order every time)."""
        return {name: getattr(self, name) for name in type(self).model_fields if name in self.model_fields_set}


class RunChanges(Changes):
    """What `Store.update_run` may change of a run. `stop_requested` is not among them: only
    `request_stop` sets it, and nothing clears it."""

    status: RunStatus = Field(default=_UNSET)
    driven_at: str | None = None
    finished_at: str | None = None
    parked_at: str | None = None
    revision: str | None = None
    cost_usd: float = Field(default=_UNSET)
    savings_usd: float = Field(default=_UNSET)
    drives: int = Field(default=_UNSET)
    segments: int = Field(default=_UNSET)
    redrives: int = Field(default=_UNSET)
    error: str | None = None
    execution: str | None = None
    driver: WorkerRef | None = None
    options: dict[str, Any] = Field(default=_UNSET)


class StepChanges(Changes):
    """What `Store.update_step` and `Store.end_attempt(step=...)` may change of a step."""

    status: StepStatus = Field(default=_UNSET)
    attempts: int = Field(default=_UNSET)
    cycle: int = Field(default=_UNSET)
    instruction: str = Field(default=_UNSET)
    message: str | None = None
    result: str | None = None
    conclusion: str | None = None
    data: Any = None
    skip_reason: str | None = None
    error: str | None = None
    cost_usd: float = Field(default=_UNSET)
    model: str = Field(default=_UNSET)
    started_at: str | None = None
    finished_at: str | None = None
    cache_break: dict[str, str] | None = None
    prefix: dict[str, Any] | None = None
    cache_ttl: str | None = None
    cache_ttl_reason: str | None = None
    savings_usd: float = Field(default=_UNSET)


def finished_event(run: Run) -> dict[str, Any]:
    return {
        "type": "run finished",
        "at": utcnow(),
        "tenant": run.tenant,
        "run_id": run.id,
        "workspace": run.workspace,
        "flow": run.flow,
        "status": str(run.status),
        "error": run.error,
        "cost_usd": run.cost_usd,
        "savings_usd": run.savings_usd,
        "drives": run.drives,
        "finished_at": run.finished_at,
    }
