"""The one cached factory for what handlers need: store, captures, executors, settings.

In Lambda it is built once per container from `Settings`. The local engine installs its own
(the store the CLI opened) for as long as a drive runs, since the interpreter calls the
handlers on its own threads.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from .callbacks import StepFunctionsCallbacks, TaskCallbacks
from .capture import CaptureSink, FolderCaptures, Redactor, S3Captures, redact_logs
from .drives import DriveStarter, StepFunctionsDrives
from .workspaces import FolderWorkspaces, S3Workspaces, WorkspaceSource
from .errors import ModelNotConfigured
from .hooks import EventBridgeOnEnd, LocalOnEnd, OnEnd
from .executors.base import Executor
from .executors.stub import StubExecutor
from .settings import Settings, settings
from .store import Store, open_store


_lock = threading.RLock()
log = logging.getLogger("laneflow.services")


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
    # Set when this worker is going away (a local runner got SIGINT or SIGTERM): one-way. No
    # new attempt is claimed, running ones see it as a stop and are marked interrupted.
    leaving: threading.Event = field(default_factory=threading.Event)

    def check_model(self, model: str) -> None:
        """Refuse a model this deployment cannot call (`ModelNotConfigured`), without reading
        its key: a function that only starts or plans runs is never given the key."""
        if model == "stub":
            return
        cfg = self.settings
        if not (cfg.anthropic_api_key_set or cfg.anthropic_secret or cfg.anthropic_enabled):
            raise ModelNotConfigured(f"model {model!r} needs ANTHROPIC_API_KEY (or run with --model stub)")

    def __post_init__(self) -> None:
        # What must never be recorded is masked by the store (every write), its captures and
        # this process's log records, all from one redactor. A key already in the settings is
        # added now; one read from Secrets Manager is added when it is read (`_model_key`),
        # which a step runner does before it records anything (`secret_values`).
        if self.settings.anthropic_api_key_set:
            self.redactor.add("ANTHROPIC_API_KEY", self.settings.anthropic_api_key.get_secret_value())  # type: ignore[union-attr]
        redact_logs(self.redactor)

    @property
    def redactor(self) -> Redactor:
        """The store's redactor: add a value to it and it is masked wherever it is recorded."""
        return self.store.redactor

    def executor(self, model: str) -> Executor:
        """The executor for a model: `stub`, else the Claude executor (one shared client),
        whose key is read the first time it is needed."""
        with _lock:
            if model == "stub":
                return self.executors.setdefault("stub", StubExecutor())
            if "anthropic" not in self.executors:
                self.check_model(model)
                key = self._model_key()
                if key is None:
                    raise ModelNotConfigured(f"model {model!r}: the model's key is read only where steps run, not here")
                from .executors.anthropic import AnthropicExecutor

                self.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=self.settings.anthropic_base_url)
            return self.executors["anthropic"]

    def _model_key(self) -> str | None:
        """The model's key: from the settings, else read from Secrets Manager once and kept
        for the life of this container. Only the functions that run steps are given the
        secret's name (and the right to read it); the others never ask."""
        with _lock:
            if self.settings.anthropic_api_key_set:
                return self.settings.anthropic_api_key.get_secret_value()  # type: ignore[union-attr]
            name = self.settings.anthropic_secret
            if not name:
                return None
            key = read_model_key(name)
            self.settings = self.settings.model_copy(update={"anthropic_api_key": SecretStr(key)})
            self.redactor.add("ANTHROPIC_API_KEY", key)
            return key

    def secret_values(self) -> dict[str, str]:
        """Values that must never be recorded (replaced by their names wherever recorded).

        Where a step runs with the model's key in Secrets Manager, this is what reads it
        first: what the step records is redacted from its first line, before the model is
        called. A key that cannot be read is not in memory, so it cannot leak; the model
        call that needs it fails with the reason."""
        try:
            key = self._model_key()
        except ModelNotConfigured as error:
            log.warning("%s", error)
            key = None
        return {"ANTHROPIC_API_KEY": key} if key else {}

    @classmethod
    def for_store(cls, store: Store, cfg: Settings | None = None) -> "Services":
        cfg = cfg or settings()
        on_end: OnEnd = (
            EventBridgeOnEnd(cfg.event_bus) if cfg.event_bus else LocalOnEnd(local_folder(store, cfg) / "events.jsonl", cfg.on_end_command)
        )
        drives = StepFunctionsDrives(cfg.state_machine_arn) if cfg.state_machine_arn else None
        return cls(store=store, captures=capture_sink(store, cfg), settings=cfg, on_end=on_end, drives=drives, workspaces=workspace_source(cfg))


def _s3_location(url: str | None) -> tuple[str, str] | None:
    """(bucket, prefix) of an `s3://bucket/prefix` setting; None for anything else."""
    if not url or not url.startswith("s3://"):
        return None
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


def workspace_source(cfg: Settings) -> WorkspaceSource | None:
    if not cfg.workspaces:
        return None
    if s3 := _s3_location(cfg.workspaces):
        return S3Workspaces(s3[0], s3[1] or "workspaces")
    return FolderWorkspaces(cfg.workspaces)


def capture_sink(store: Store, cfg: Settings) -> CaptureSink:
    """Where tool calls are captured: the folder LANEFLOW_CAPTURE_DIR names, else S3 in the
    bucket LANEFLOW_CAPTURE_BUCKET names, or the store's own bucket (the cloud: a DynamoDB
    store with a bucket), or the bucket of S3 workspaces; else a folder beside the store."""
    if cfg.capture_dir:
        return FolderCaptures(cfg.capture_dir, store.redactor)
    workspaces = _s3_location(cfg.workspaces)
    bucket = cfg.capture_bucket or getattr(store, "bucket", None) or (workspaces[0] if workspaces else None)
    if bucket:
        return S3Captures(bucket, region=getattr(store, "region", None), redactor=store.redactor)
    return FolderCaptures(local_folder(store, cfg) / "captures", store.redactor)


def local_folder(store: Store, cfg: Settings) -> Path:
    """Where local files of the store's go (captures, the on-end log): beside an SQLite
    store's file, else beside LANEFLOW_CAPTURE_DIR, else a folder under the temp folder.
    Never the working folder: Lambda's (/var/task) is read-only, and a person's is theirs."""
    if cfg.capture_dir:
        return Path(cfg.capture_dir).parent
    db = getattr(store, "path", None)
    if db and str(db) != ":memory:":
        return Path(db).parent
    return Path(tempfile.gettempdir()) / "laneflow"


_current: Services | None = None


def services() -> Services:
    """The installed services, or ones built from the environment (first call in Lambda).
    Building them reads no secret: the model's key is read when a step first needs it."""
    global _current
    with _lock:
        if _current is None:
            cfg = settings()
            _current = Services.for_store(open_store(cfg.store_url), cfg)
        return _current


def read_model_key(name: str) -> str:
    """The model's key from the Secrets Manager secret `name`: its SecretString, or the
    `ANTHROPIC_API_KEY` field of a JSON secret (what the console's key/value form writes).
    Raises `ModelNotConfigured` naming the secret and the error code, never the value."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        value = boto3.client("secretsmanager").get_secret_value(SecretId=name).get("SecretString") or ""
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "error")
        raise ModelNotConfigured(f"the model's key could not be read from Secrets Manager secret {name!r}: {code}") from None
    except BotoCoreError as error:
        raise ModelNotConfigured(f"the model's key could not be read from Secrets Manager secret {name!r}: {type(error).__name__}") from None
    value = value.strip()
    if value.startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError:
            fields = None
        if isinstance(fields, dict):
            value = str(fields.get("ANTHROPIC_API_KEY") or "").strip()
    if not value:
        raise ModelNotConfigured(f"Secrets Manager secret {name!r} holds no model key (a string, or JSON with ANTHROPIC_API_KEY)")
    return value


def installed() -> Services | None:
    """The services installed now (None: handlers would build them from the environment)."""
    with _lock:
        return _current


def install(svc: Services | None) -> None:
    """Make `svc` what every handler in this process uses (None: build from the environment)."""
    global _current
    with _lock:
        _current = svc
