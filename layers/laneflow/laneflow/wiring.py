"""The wiring: the one module that builds adapters. It makes the `Services` (the ports) that
a process's handlers hand to the use cases: store, captures, executors, callbacks, folders,
telemetry, settings; and the other adapters an entrypoint works with (the store a URL
names, the liveness of workers, the embedded engine and its drives, a step worker's handlers).

In Lambda they are built once per container from `Settings`. The local engine installs its
own (the store the CLI opened) for each handler call of its drives, on the interpreter's
threads (`bound`), so drives with different services run at once.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneflow.adapters.aws.ecs import EcsTasks, task_alive, task_gone_for
from laneflow.adapters.aws.eventbridge import EventBridgeOnEnd
from laneflow.adapters.aws.s3 import S3Captures, S3Workspaces, SyncedFolders
from laneflow.adapters.aws.secrets import SecretsManagerSecrets, read_model_key
from laneflow.adapters.aws.stepfunctions import (
    StepFunctionsCallbacks,
    StepFunctionsDrives,
    execution_alive,
)
from laneflow.adapters.crash import KillingCrashPoints
from laneflow.adapters.engine.sandbox import RelayCallbacks
from laneflow.adapters.engine.template import Template
from laneflow.adapters.executors.isolation import choose
from laneflow.adapters.local.captures import FolderCaptures
from laneflow.adapters.local.on_end import LocalOnEnd
from laneflow.adapters.local.secrets import LocalSecrets, PrivateSecretFiles
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.adapters.logs import redact_logs
from laneflow.adapters.store import open_store as _open_store
from laneflow.adapters.store.provision import init_store as _init_store
from laneflow.adapters.workers import Liveness
from laneflow.domain.records import Run
from laneflow.paths import project_root
from laneflow.ports import (
    CaptureSink,
    Executor,
    NoTelemetry,
    OnEnd,
    SecretSource,
    Services,
    StepJob,
    Store,
    Telemetry,
    WorkspaceSource,
)
from laneflow.ports.services import CrashPoints, NoCrashPoints
from laneflow.settings import Settings, environ, settings

if TYPE_CHECKING:  # imported where they are built: a command that only reads the store loads none of them
    from laneflow.adapters.aws.scheduler import SchedulerTriggers
    from laneflow.adapters.engine.local import HandlerRegistry, LocalDrives, LocalEngine
    from laneflow.usecases.reconcile import ReconcileReport

_lock = threading.RLock()

log = logging.getLogger("laneflow.wiring")


def _s3_location(url: str | None) -> tuple[str, str] | None:
    """(bucket, prefix) of an `s3://bucket/prefix` setting; None for anything else."""
    if not url or not url.startswith("s3://"):
        return None
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


def open_store(url: str | None) -> Store:
    """The store a URL names (`sqlite:///PATH`, `dynamodb://TABLE?...`; None: the SQLite
    file under .laneflow/), for every process that builds its services here."""
    return _open_store(url)


def init_store(url: str) -> list[str]:
    """Create what the store a URL names needs (a DynamoDB table and bucket), if missing;
    what was done, one line each."""
    return _init_store(url)


def liveness() -> Liveness:
    """Whether a worker is still there, as this machine can tell: its own processes, a
    Lambda by its deadline (reconcile on a person's machine)."""
    return Liveness()


def make_executor(cfg: Settings) -> Callable[[str, str | None], Executor]:
    """The executor factory: `stub`, else the Claude executor over the model's key."""

    def make(model: str, key: str | None) -> Executor:
        if model == "stub":
            from laneflow.adapters.executors.stub import StubExecutor

            return StubExecutor(isolation=choose(cfg.isolation))
        from laneflow.adapters.executors.anthropic import AnthropicExecutor

        return AnthropicExecutor(api_key=key, base_url=cfg.anthropic_base_url, isolation=choose(cfg.isolation))

    return make


def telemetry() -> Telemetry:
    """Powertools in Lambda (the process's own environment says so); nothing locally, where
    Powertools is not even imported (its Tracer imports the X-Ray SDK and botocore)."""
    if not settings().in_lambda:
        return NoTelemetry()
    from laneflow.adapters.aws import powertools

    return powertools.PowertoolsTelemetry()


def tool_definitions(job: StepJob) -> list[dict[str, Any]]:
    """`Services.tool_definitions`: the step tools' registry, imported at the first call (it
    imports the MCP SDK, which a command that only reads the store never needs)."""
    from laneflow.adapters.executors.registry import tool_definitions as definitions

    return definitions(job)


def for_store(store: Store, cfg: Settings | None = None) -> Services:
    """The services of a process whose store is `store`: captures beside it, the on-end hook
    (EventBridge in the cloud, a local file and command otherwise), drives and workspaces as
    the settings say."""
    cfg = cfg or settings()
    on_end: OnEnd = (
        EventBridgeOnEnd(cfg.event_bus)
        if cfg.event_bus
        else LocalOnEnd(local_folder(store, cfg) / "events.jsonl", cfg.on_end_command)
    )
    drives = StepFunctionsDrives(cfg.state_machine_arn) if cfg.state_machine_arn else None
    svc = Services(
        store=store,
        captures=capture_sink(store, cfg),
        settings=cfg,
        callbacks=StepFunctionsCallbacks(),
        folders=SyncedFolders(),
        make_executor=make_executor(cfg),
        read_secret=read_model_key,
        on_end=on_end,
        drives=drives,
        continuations=drives,
        workspaces=workspace_source(cfg),
        telemetry=telemetry(),
        tasks=EcsTasks(),  # its client is made only if a run with a Fargate-task attempt is stopped
        secrets=secret_source(cfg),
        secret_files=PrivateSecretFiles(),
        tool_definitions=tool_definitions,
        crashpoints=crash_points(cfg),
        triggers=schedule_triggers(cfg),
    )
    # This process's log records are masked by the store's redactor from now on (the
    # services made from these, `dataclasses.replace`d, share it).
    redact_logs(svc.redactor)
    return svc


def schedule_triggers(cfg: Settings) -> SchedulerTriggers | None:
    """Schedules' EventBridge Scheduler schedules where the deployment names its group, the
    fire function and the role (the API's function in the cloud); else none: locally
    `serve` and `laneflow schedule tick` fire from the store."""
    if not (cfg.schedule_group and cfg.schedule_target and cfg.schedule_role):
        return None
    from laneflow.adapters.aws.scheduler import SchedulerTriggers  # botocore: only where it is used

    return SchedulerTriggers(cfg.schedule_group, cfg.schedule_target, cfg.schedule_role, cfg.schedule_dead_letter)


def crash_points(cfg: Settings) -> CrashPoints:
    """Nothing happens at the use cases' crash points, except in a process the
    crash-injection suite started (LANEFLOW_CRASH_AT), which dies at the point it names."""
    if cfg.crash_at:
        return KillingCrashPoints(cfg.crash_at, cfg.engine_worker)
    return NoCrashPoints()


def secret_source(cfg: Settings) -> SecretSource:
    """Where agents' declared secrets are read: Secrets Manager (`laneflow/<tenant>/<NAME>`)
    where the deployment says so (the functions and tasks that run steps), else this
    machine's `--secrets` file, the workspace's `.secrets.env` or the environment."""
    if cfg.secret_source == "secretsmanager":
        return SecretsManagerSecrets()
    return LocalSecrets(cfg.secrets_file, environ=environ())


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

# Services bound to this thread for as long as one handler runs (the embedded engine's
# drives: each execution's handlers use their own drive's services).
_bound = threading.local()


@contextmanager
def bound(svc: Services) -> Iterator[None]:
    """Make `svc` what `services()` returns on this thread until the block ends."""
    before = getattr(_bound, "svc", None)
    _bound.svc = svc
    try:
        yield
    finally:
        _bound.svc = before


def services() -> Services:
    """The services bound to this thread (a handler of an embedded drive), else the installed
    ones, else ones built from the environment (first call in Lambda). Building them reads
    no secret: the model's key is read when a step first needs it."""
    global _current
    svc: Services | None = getattr(_bound, "svc", None)
    if svc is not None:
        return svc
    with _lock:
        if _current is None:
            cfg = settings()
            _current = for_store(open_store(cfg.store_url), cfg)
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


def reconcile_cloud(svc: Services) -> ReconcileReport:
    """The scheduled reconcile: drives are Step Functions executions, re-driven by starting
    a new one."""
    drives = svc.drives

    def redrive(run: Run) -> None:
        assert drives is not None
        drives.start(run.tenant, run.id)

    from laneflow.usecases.reconcile import Reconciler

    liveness = Liveness(execution_alive=execution_alive(), task_alive=task_alive(), task_gone_for=task_gone_for())
    return Reconciler(svc, liveness, redrive=redrive if drives else None).run()


def sandbox_services(environ: Mapping[str, str], *, engine_gone: Callable[[], None] | None = None) -> Services:
    """The services of a sandbox worker (laneflow.entrypoints.sandbox_worker): the store
    and settings its environment names, every attempt in a scratch copy of its workspace,
    and its callbacks through Step Functions, or locally through the engine's relay (whose
    closing, its engine gone, calls `engine_gone`)."""
    cfg = Settings.from_env(dict(environ))
    svc = for_store(open_store(cfg.store_url), cfg)
    relay = environ.get("LANEFLOW_RELAY")
    return dataclasses.replace(
        svc,
        callbacks=RelayCallbacks(relay, on_closed=engine_gone) if relay else svc.callbacks,
        folders=SyncedFolders(scratch=True),
        sandbox=True,
    )


def step_worker_services(environ: Mapping[str, str], *, engine_gone: Callable[[], None] | None = None) -> Services:
    """The services of the embedded engine's step worker (laneflow.entrypoints.step_worker):
    the store and settings its environment names, its callbacks through the engine's relay
    (whose closing, its engine gone, calls `engine_gone`)."""
    cfg = Settings.from_env(dict(environ))
    svc = for_store(open_store(cfg.store_url), cfg)
    return dataclasses.replace(svc, callbacks=RelayCallbacks(environ["LANEFLOW_RELAY"], on_closed=engine_gone))


def local_engine(svc: Services) -> LocalEngine:
    """The embedded engine over `svc`: its handlers use them (bound per call), whatever else
    the process drives at the same time."""
    from laneflow.adapters.engine.local import LocalEngine

    return LocalEngine(svc, bind=bound)


def local_drives(svc: Services) -> LocalDrives:
    """Drives started on threads of this process (`laneflow serve`), on the embedded engine."""
    from laneflow.adapters.engine.local import LocalDrives

    return LocalDrives(lambda: local_engine(svc), pool=svc.settings.local_drives)


def serving(svc: Services, workspaces: str | Path) -> Services:
    """`svc` as `laneflow serve` runs them: the workspaces of a folder, and drives started
    on threads of this process."""
    svc.workspaces = FolderWorkspaces(workspaces)
    svc.drives = local_drives(svc)
    return svc


def step_worker_registry(svc: Services) -> HandlerRegistry:
    """The template's handlers as a step worker of the embedded engine answers calls with:
    each call with `svc` bound, none once its engine's worker is leaving."""
    from laneflow.adapters.engine.local import HandlerRegistry

    return HandlerRegistry(Template.load(project_root() / "template.yaml"), svc.leaving, bind=lambda: bound(svc))
