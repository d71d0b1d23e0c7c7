"""The one cached factory for what handlers need: store, captures, executors, settings.

In Lambda it is built once per container from `Settings`. The local engine installs its own
(the store the CLI opened) for as long as a drive runs, since the interpreter calls the
handlers on its own threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .callbacks import StepFunctionsCallbacks, TaskCallbacks
from .capture import CaptureSink, FolderCaptures, Redactor, redact_logs
from .drives import DriveStarter, StepFunctionsDrives
from .workspaces import FolderWorkspaces, S3Workspaces, WorkspaceSource
from .errors import ModelNotConfigured
from .hooks import EventBridgeOnEnd, LocalOnEnd, OnEnd
from .executors.base import Executor
from .executors.stub import StubExecutor
from .settings import Settings, settings
from .store import Store, open_store


_lock = threading.RLock()


@dataclass
class Services:
    store: Store
    captures: CaptureSink
    settings: Settings
    executors: dict[str, Executor] = field(default_factory=dict)
    callbacks: TaskCallbacks = field(default_factory=StepFunctionsCallbacks)
    on_end: OnEnd | None = None  # told about every run that ends
    drives: DriveStarter | None = None  # starts a new drive of a run (API, reconcile in the cloud)
    workspaces: WorkspaceSource | None = None  # finds a workspace by name (API)

    def __post_init__(self) -> None:
        # What must never be recorded is masked by the store (every write), its captures and
        # this process's log records, all from one redactor.
        for name, value in self.secret_values().items():
            self.redactor.add(name, value)
        redact_logs(self.redactor)

    @property
    def redactor(self) -> Redactor:
        """The store's redactor: add a value to it and it is masked wherever it is recorded."""
        return self.store.redactor

    def executor(self, model: str) -> Executor:
        """The executor for a model: `stub`, else the Claude executor (one shared client)."""
        with _lock:
            if model == "stub":
                return self.executors.setdefault("stub", StubExecutor())
            if "anthropic" not in self.executors:
                if not self.settings.anthropic_api_key_set:
                    raise ModelNotConfigured(f"model {model!r} needs ANTHROPIC_API_KEY (or run with --model stub)")
                from .executors.anthropic import AnthropicExecutor

                key = self.settings.anthropic_api_key
                self.executors["anthropic"] = AnthropicExecutor(
                    api_key=key.get_secret_value() if key else None, base_url=self.settings.anthropic_base_url
                )
            return self.executors["anthropic"]

    def secret_values(self) -> dict[str, str]:
        """Values that must never be recorded (replaced by their names wherever recorded)."""
        key = self.settings.anthropic_api_key
        return {"ANTHROPIC_API_KEY": key.get_secret_value()} if key else {}

    @classmethod
    def for_store(cls, store: Store, cfg: Settings | None = None) -> "Services":
        cfg = cfg or settings()
        root = capture_root(store, cfg)
        on_end: OnEnd = (
            EventBridgeOnEnd(cfg.event_bus) if cfg.event_bus else LocalOnEnd(root.parent / "events.jsonl", cfg.on_end_command)
        )
        drives = StepFunctionsDrives(cfg.state_machine_arn) if cfg.state_machine_arn else None
        return cls(store=store, captures=FolderCaptures(root, store.redactor), settings=cfg, on_end=on_end, drives=drives, workspaces=workspace_source(cfg))


def workspace_source(cfg: Settings) -> WorkspaceSource | None:
    if not cfg.workspaces:
        return None
    if cfg.workspaces.startswith("s3://"):
        bucket, _, prefix = cfg.workspaces[5:].partition("/")
        return S3Workspaces(bucket, prefix or "workspaces")
    return FolderWorkspaces(cfg.workspaces)


def capture_root(store: Store, cfg: Settings) -> Path:
    """Captures live beside an SQLite store's file (or where LANEFLOW_CAPTURE_DIR says)."""
    if cfg.capture_dir:
        return Path(cfg.capture_dir)
    db = getattr(store, "path", None)
    if db and str(db) != ":memory:":
        return Path(db).parent / "captures"
    return Path(".laneflow") / "captures"


_current: Services | None = None


def services() -> Services:
    """The installed services, or ones built from the environment (first call in Lambda)."""
    global _current
    with _lock:
        if _current is None:
            cfg = settings()
            if cfg.anthropic_secret and not cfg.anthropic_api_key_set:
                # The model's key lives in Secrets Manager (cached by Powertools Parameters).
                from aws_lambda_powertools.utilities import parameters
                from pydantic import SecretStr

                cfg = cfg.model_copy(update={"anthropic_api_key": SecretStr(str(parameters.get_secret(cfg.anthropic_secret)))})
            _current = Services.for_store(open_store(cfg.store_url), cfg)
        return _current


def installed() -> Services | None:
    """The services installed now (None: handlers would build them from the environment)."""
    with _lock:
        return _current


def install(svc: Services | None) -> None:
    """Make `svc` what every handler in this process uses (None: build from the environment)."""
    global _current
    with _lock:
        _current = svc
