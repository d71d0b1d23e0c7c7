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

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from laneflow.domain.apis import ApiSpec
from laneflow.domain.inbox import Note, Peer
from laneflow.domain.mcp import McpServer
from laneflow.domain.messages import ExecutionInput
from laneflow.domain.records import (
    EventType,
    ModelCall,
    Run,
)
from laneflow.domain.tools import DEFAULT_WEB_MAX_USES
from laneflow.domain.workers import FargateTask, WorkerRef


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
    delegates: tuple[str, ...] = ()  # agent `delegates:`: the agents its `delegate` tool may call
    web_max_uses: int = DEFAULT_WEB_MAX_USES  # agent `web_max_uses`: each web tool's max_uses a request
    mcp: tuple[McpServer, ...] = ()  # agent and AGENTS.md `mcp:`: its `mcp__<name>__*` tools (secrets unfilled)
    network: tuple[str, ...] = ()  # agent `network:`, checked: what its programs reach through the egress proxy
    cache_ttl: str = "5m"  # the TTL its cache writes ask for ("5m" | "1h"): laneflow.domain.cache_ttl
    hold: str | None = None  # a readied sibling's gate: its first request waits for the lead's reply there


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


class Delegator(Protocol):
    """Runs a delegate (agent.md `delegates:`) inside the calling step's attempt."""

    def delegate(self, agent: str, task: str) -> str:
        """Run `agent`'s own model loop on `task` and return its final reply.
        `DelegationRefused` (laneflow.domain.delegation) for a call that cannot run; a stop
        ends it (`StepStopped`)."""


class ExecutionSink(Protocol):
    """Where an executor reports. Every method is a fenced write about this attempt.
    `inbox` is the step's colleagues and inbox when its agent has `peers` or `ask`, else None.
    A sink that can run delegates also has `delegator` (a `Delegator`; the `delegate` tool
    asks for it by name, so a sink without one refuses the call)."""

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

    def why_stopped(self, task_arn: str, cluster: str | None = None) -> str | None:
        """Why a stopped sandbox task stopped, when it was for memory or an eviction (what
        its attempt's reason says); None for any other stop, or while it runs."""


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

    def gone_for(self, worker: WorkerRef | None) -> str | None:
        """Why a worker that is gone went, when it was killed for memory or evicted (its
        attempt's next one runs one `size:` up); None for any other end, or cannot tell."""


# Defined in their own modules, named here with the rest.
from laneflow.ports.services import NoTelemetry as NoTelemetry  # noqa: E402
from laneflow.ports.services import Services as Services  # noqa: E402
from laneflow.ports.services import Telemetry as Telemetry  # noqa: E402
from laneflow.ports.store import Store as Store  # noqa: E402
