"""`Services`: the ports one process's use cases work through, built by `laneflow.wiring`,
and `Telemetry`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import SecretStr

from laneflow.domain.cache import cache_now
from laneflow.domain.errors import ModelNotConfigured
from laneflow.domain.records import (
    ModelCall,
)
from laneflow.domain.redaction import Redactor
from laneflow.ports import (
    CaptureSink,
    DriveContinuer,
    DriveStarter,
    Executor,
    OnEnd,
    SandboxTasks,
    SecretFiles,
    SecretSource,
    StepJob,
    TaskCallbacks,
    WorkspaceFolders,
    WorkspaceSource,
)
from laneflow.ports.schedules import ScheduleTriggers
from laneflow.ports.store import Store
from laneflow.settings import Settings

log = logging.getLogger("laneflow.ports")


class Telemetry(Protocol):
    metrics_on: bool

    def bind(self, **keys: Any) -> None:
        """Add keys (run, step, attempt) to every later log line of this invocation."""

    def step_metrics(
        self,
        *,
        cost_usd: float,
        duration_ms: float,
        calls: list[ModelCall],
        gate_wait_ms: float | None,
        savings_usd: float | None = None,
    ) -> None:
        """Emit one step's metrics; `savings_usd` (what its prompt cache saved, when given)
        as `CacheSavingsUSD`."""


class NoTelemetry:
    """Telemetry where there is none (locally): binds nothing, emits nothing."""

    metrics_on = False

    def bind(self, **keys: Any) -> None:
        return None

    def step_metrics(
        self,
        *,
        cost_usd: float,
        duration_ms: float,
        calls: list[ModelCall],
        gate_wait_ms: float | None,
        savings_usd: float | None = None,
    ) -> None:
        return None


class PrefixWatch(Protocol):
    """Completes a waiting step's token once its prefix is written, released or past the wait's cap."""

    def watch(self, tenant: str, key: str, token: str) -> None: ...


class CrashPoints(Protocol):
    """Where the step lifecycle tells it passed a named point (laneflow.usecases.crashpoints):
    nothing happens, except under the crash-injection suite, whose processes die there."""

    def reached(self, name: str) -> None:
        """The use case passed the point `name`."""


class NoCrashPoints:
    """Crash points that do nothing: every process but the crash-injection suite's."""

    def reached(self, name: str) -> None:
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
    triggers: ScheduleTriggers | None = None  # schedules' EventBridge Scheduler schedules (cloud)
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    crashpoints: CrashPoints = field(default_factory=NoCrashPoints)  # the crash-injection suite's
    secrets: SecretSource | None = None  # declared secrets' values (None: a step declaring one fails)
    secret_files: SecretFiles | None = None  # where `@NAME` secrets are written for an attempt
    # The tool definitions a step's request carries (part of its cached prefix), as the
    # executors build them; None: counted as no tools (the prefix of the stable system alone).
    tool_definitions: Callable[[StepJob], list[dict[str, Any]]] | None = None
    # Watches prefix records for the steps of this process's engine waiting on another
    # process's writer (local engines on one store: laneflow.usecases.prefix_gate); None in the cloud.
    prefix_watch: PrefixWatch | None = None
    # Set when this worker is going away (a local runner got SIGINT or SIGTERM): one-way. No
    # new attempt is claimed, running ones see it as a stop and are marked interrupted.
    leaving: threading.Event = field(default_factory=threading.Event)
    executors: dict[str, Executor] = field(default_factory=dict)
    # This process is a sandbox worker (laneflow.entrypoints.sandbox_worker): the only kind of
    # worker that may run a sandboxed agent's step, each attempt in a scratch copy.
    sandbox: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    # The model's key as read from the secret store (`_model_key`), held for the life of this
    # process; the settings stay as they were given.
    _key: SecretStr | None = field(default=None, repr=False, compare=False)

    def cache_now(self) -> float:
        """Now on the prompt cache's clock (the wall clock unless LANEFLOW_CACHE_CLOCK speeds it)."""
        return cache_now(self.settings.cache_clock)

    def __post_init__(self) -> None:
        # What must never be recorded is masked by the store (every write), its captures and
        # this process's log records (the wiring has them masked by it), all from one
        # redactor. A key already in the settings is added now; one read from the secret
        # store is added when it is read (`_model_key`), which a step runner does before it
        # records anything (`secret_values`).
        if self.settings.anthropic_api_key_set:
            self.redactor.add("ANTHROPIC_API_KEY", self.settings.anthropic_api_key.get_secret_value())  # type: ignore[union-attr]

    @property
    def redactor(self) -> Redactor:
        """The store's redactor: add a value to it and it is masked wherever it is recorded."""
        return self.store.redactor

    def check_model(self, model: str) -> None:
        """Refuse a model this deployment cannot call (`ModelNotConfigured`), without reading
        its key: a function that only starts or plans runs is never given the key."""
        if model == "stub":
            return
        if not (self.settings.claude_configured or self._key is not None):
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
            self._key = SecretStr(key)
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
        if self._key is not None:
            return self._key.get_secret_value()
        if not self.settings.anthropic_api_key_set:
            return None
        return self.settings.anthropic_api_key.get_secret_value()  # type: ignore[union-attr]
