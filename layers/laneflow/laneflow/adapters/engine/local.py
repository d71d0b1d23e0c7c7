"""The embedded engine: the deployed state machine definition, executed by moto's ASL
interpreter, with the Lambda Task states answered by the handlers in `functions/`, in-process.

Why this shape (docs/ARCHITECTURE.md, "The embedded engine"):
- moto's Step Functions backend is used directly, not through `mock_aws`: nothing in the
  process is mocked, so a DynamoDB or S3 store behind the engine reaches its real endpoint
  and the process's credentials are left alone.
- The interpreter calls Lambda through `lambda_eval_utils._invoke_lambda_function`. That one
  function is replaced by a direct call of the handler (2-3 ms per Task instead of building
  a boto3 client per call). It is a moto internal, so moto is pinned exactly (pyproject) and
  tests/unit/test_engine_patch.py fails if the hook moves. The hooks, and which drive
  serves which execution, are in hooks.py; this module is the drives themselves.
- Drives run at once: each execution is answered by its own drive's handlers and services
  (moto_patches notes which execution a Lambda call serves), never by globally installed
  ones. `laneflow serve` drives on a bounded pool (LocalDrives) and forgets each execution
  once it ended, so a long-lived process stays flat. A sandboxed step's ECS task is
  answered by the sandbox workers of the drive whose execution asks, found the same way.
- A drive is one execution, or a chain of them: an execution whose history budget is spent
  continues the drive in a fresh one (NextDrive), which the engine starts on the same
  interpreter, serves with the same handlers and follows (`LocalContinuations`). The engine
  waits for the last and, if it ended without closing the run (a crashed definition),
  closes the run `failed` with the reason: no run is left `running` with nothing working on it.
- Ctrl-C (or SIGTERM, raised as a KeyboardInterrupt) is this worker going away, not a
  failure: no handler runs any more, the drive's running attempts are marked interrupted by
  exact identity and its drive ended, so the run stays resumable (reconcile.leave_drive).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import secrets as _secrets
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from laneflow.adapters.engine import moto_patches, step_workers
from laneflow.adapters.engine.early import EarlyStarts
from laneflow.adapters.engine.hooks import ACCOUNT as ACCOUNT
from laneflow.adapters.engine.hooks import REGION as REGION
from laneflow.adapters.engine.hooks import LocalCallbacks as LocalCallbacks
from laneflow.adapters.engine.hooks import _backend as _backend
from laneflow.adapters.engine.hooks import _function_error as _function_error
from laneflow.adapters.engine.hooks import _invoke_in_process as _invoke_in_process
from laneflow.adapters.engine.hooks import _registries as _registries
from laneflow.adapters.engine.hooks import _registry_lock as _registry_lock
from laneflow.adapters.engine.hooks import _sandboxes as _sandboxes
from laneflow.adapters.engine.hooks import execution_arn as execution_arn
from laneflow.adapters.engine.hooks import install_interpreter_hook as install_interpreter_hook
from laneflow.adapters.engine.hooks import overrides_environment as overrides_environment
from laneflow.adapters.engine.hooks import registry_of as registry_of
from laneflow.adapters.engine.hooks import serve_execution as serve_execution
from laneflow.adapters.engine.prefix_watch import LocalPrefixWatch
from laneflow.adapters.engine.sandbox import Sandboxes
from laneflow.adapters.engine.step_workers import StepWorkers
from laneflow.adapters.engine.template import FunctionSpec, Template
from laneflow.adapters.workers import Liveness, current_worker
from laneflow.domain.lanes import sandboxed_agents
from laneflow.domain.messages import ExecutionInput
from laneflow.domain.records import Run
from laneflow.paths import project_root
from laneflow.ports import Services
from laneflow.settings import environ
from laneflow.usecases.end_run import close_run
from laneflow.usecases.masking import masking_of
from laneflow.usecases.reconcile import leave_drive

ROLE = f"arn:aws:iam::{ACCOUNT}:role/laneflow-local"

# How long a leaving worker waits for the handlers still running to see it and return, so
# the record it leaves is final; a second Ctrl-C does not wait (reconcile finishes the job).
LEAVE_WAIT_S = 5.0


for _noisy in ("moto", "moto.stepfunctions"):
    logging.getLogger(_noisy).setLevel(logging.CRITICAL)


class LambdaContext:
    """What a Lambda handler's `context` offers, for an in-process call."""

    local = True  # the worker is this process (laneflow.workers)

    def __init__(self, function: FunctionSpec, timeout_s: float = 900.0):
        self.function_name = function.logical_id
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function.logical_id}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function.logical_id}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class HandlerRegistry:
    """The template's functions, their handler modules loaded from `functions/<name>/`."""

    def __init__(
        self,
        template: Template,
        leaving: threading.Event | None = None,
        bind: Callable[[], AbstractContextManager[Any]] | None = None,
    ):
        self.functions = template.functions()
        self.bind = bind  # makes this drive's services the handlers' while one runs
        self._modules: dict[str, ModuleType] = {}
        self._lock = threading.Lock()
        self.leaving = leaving  # set: this worker is going away, and runs no handler any more
        self._running = 0
        self._idle = threading.Condition()
        # Where the steps' calls go when they do not run here (LANEFLOW_STEP_WORKERS), and
        # which functions those are: RunStep's (functions/run_step).
        self.step_workers: StepWorkers | None = None
        self.worker_functions = {i for i, spec in self.functions.items() if spec.code_dir.name == "run_step"}
        # Siblings readied while they wait at their gate (early.py): WaitForLead's answer
        # starts their RunStep call, which their RunSibling state then takes.
        waits = {i for i, spec in self.functions.items() if spec.code_dir.name == "wait_for_lead"}
        self.wait_functions = waits
        self.early: EarlyStarts | None = (
            EarlyStarts(self.invoke, next(iter(self.worker_functions))) if self.worker_functions and waits else None
        )

    def load(self, logical_id: str) -> None:
        """Import a function's handler module now, not at its first call."""
        self._handler(logical_id)

    def _handler(self, logical_id: str) -> Callable[[Any, Any], Any]:
        spec = self.functions[logical_id]
        module_name, attr = spec.handler.rsplit(".", 1)
        with self._lock:
            module = self._modules.get(logical_id)
            if module is None:
                path = spec.code_dir / (module_name.replace(".", "/") + ".py")
                loader_spec = importlib.util.spec_from_file_location(f"laneflow_functions.{logical_id}", path)
                assert loader_spec and loader_spec.loader, path
                module = importlib.util.module_from_spec(loader_spec)
                loader_spec.loader.exec_module(module)
                self._modules[logical_id] = module
        handler: Callable[[Any, Any], Any] = getattr(module, attr)
        return handler

    def invoke(self, function_name: str, payload: Any) -> dict[str, Any]:
        """Answer like the Lambda Invoke API: the handler's result, or a function error
        `{errorType, errorMessage}` whose type the state machine retries and catches by."""
        logical_id = function_name.rsplit(":", 1)[-1]
        if logical_id not in self.functions:
            return _function_error("ResourceNotFoundException", f"no function {logical_id} in template.yaml")
        with self._idle:
            if self.leaving is not None and self.leaving.is_set():
                # Nothing more is decided or claimed by a drive whose worker is leaving: the run
                # is left as it stands, for the next drive.
                return _function_error("WorkerLeaving", "this worker is going away")
            self._running += 1
        try:
            readied = self.early.take(payload) if self.early is not None and logical_id in self.worker_functions else None
            if readied is not None:
                return readied.result()  # this sibling was readied at its gate: its call's answer
            workers = self.step_workers if logical_id in self.worker_functions else None
            answered = workers.invoke(logical_id, payload) if workers is not None else None
            if answered is not None:
                return answered  # already the Invoke API's shape, made by the worker's registry
            with self.bind() if self.bind is not None else nullcontext():
                result = self._handler(logical_id)(payload, LambdaContext(self.functions[logical_id]))
            if self.early is not None and logical_id in self.wait_functions:
                self.early.after_wait(payload, {"Payload": result})
        except Exception as exc:  # every error crosses as a Lambda function error
            logging.getLogger("laneflow.engine").debug("handler %s raised", logical_id, exc_info=True)
            return _function_error(type(exc).__name__, str(exc), traceback.format_exception(exc)[-5:])
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()
        return {"StatusCode": 200, "Payload": json.loads(json.dumps(result))}

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no handler runs (True), or the timeout passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)


def child_environ(svc: Services, inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a local sandbox worker inherits: this process's environment (AWS endpoints and
    the like) and this engine's settings as the variables they are read from (the CLI may
    have been given them as flags: the store, captures, the model's settings, the secrets
    file, the isolation). The programs its tools run see none of it: their environment is
    built from scratch."""
    env = dict(environ() if inherited is None else inherited)
    env.update(svc.settings.to_env())
    env["LANEFLOW_STORE"] = svc.store.url
    env.pop("AWS_LAMBDA_FUNCTION_NAME", None)
    return env


@dataclass
class DriveResult:
    """How a drive ended. Its `run` is read from the store when first asked for (with every
    step: a run of 100,000 steps is a gigabyte of records, which a drive itself never holds)."""

    store: Any  # the store the run is read from
    tenant: str
    run_id: str
    execution_arn: str  # the drive's last execution
    execution_status: str
    error: str | None = None
    cause: str | None = None
    # Every execution of the drive, in order: its first, then each continuation NextDrive
    # started once the one before had spent its history budget (the last one's history is
    # `LocalEngine.history`; the others' were shown to `LocalEngine.on_retire`).
    executions: list[str] = dataclasses.field(default_factory=list)

    @functools.cached_property
    def run(self) -> Run:
        run: Run = self.store.get_run(self.tenant, self.run_id)
        return run


class LocalContinuations:
    """The engine's continuations for its handlers: NextDrive's continuation is a fresh
    execution on this process's interpreter, served by the same drive's handlers and
    sandbox workers, and followed by the drive that started the first (`LocalEngine.drive`
    waits for each in turn)."""

    def __init__(self, engine: LocalEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self.followed: dict[str, list[str]] = {}  # run id -> its drive's executions, in order

    def follow(self, run_id: str, arn: str) -> None:
        with self._lock:
            self.followed[run_id] = [arn]

    def after(self, run_id: str, arn: str) -> str | None:
        """The execution that continued `arn`, if one did."""
        with self._lock:
            chain = self.followed.get(run_id, [])
            at = chain.index(arn) if arn in chain else -1
            return chain[at + 1] if 0 <= at < len(chain) - 1 else None

    def chain(self, run_id: str) -> list[str]:
        with self._lock:
            return list(self.followed.get(run_id, []))

    def done(self, run_id: str) -> list[str]:
        with self._lock:
            return self.followed.pop(run_id, [])

    def continue_drive(self, start: ExecutionInput, name: str) -> str:
        machine = self.engine.state_machine_arn
        arn = execution_arn(machine, name)
        with self._lock:
            chain = self.followed.setdefault(start.run_id, [])
            if arn in chain:  # a retried NextDrive: the same execution
                return arn
            chain.append(arn)
        self.engine.serve(arn)
        execution = _backend().start_execution(machine, name=name, execution_input=start.model_dump_json())
        if execution.execution_arn != arn:  # pragma: no cover - guarded by test_engine_patch
            raise RuntimeError(f"moto named the execution {execution.execution_arn}, not {arn}")
        return arn


class LocalEngine:
    """Runs drives of runs through the real definition, one execution per drive.

    Drives of a process run at once: the handlers of an execution get the services of the
    engine that started it (`bind`), whatever else runs."""

    _machines: dict[str, str] = {}

    def __init__(
        self,
        svc: Services,
        *,
        bind: Callable[[Services], AbstractContextManager[Any]],
        project: str | Path | None = None,
        local_sandboxes: bool = True,
        substitutions: dict[str, str] | None = None,
        warm_sandboxes: bool | None = None,
    ):
        # Tokens are completed on this process's interpreter, and a drive continues in a fresh
        # execution of it: the engine's own copy of the services says so (the caller's are
        # left as they are).
        self.continuations = LocalContinuations(self)
        callbacks = LocalCallbacks()
        self.svc = dataclasses.replace(
            svc,
            callbacks=callbacks,
            continuations=self.continuations,
            prefix_watch=LocalPrefixWatch(svc.store, callbacks, svc.cache_now),
        )
        self.project = Path(project) if project else project_root()
        self.template = Template.load(self.project / "template.yaml")
        self.registry = HandlerRegistry(self.template, svc.leaving, bind=lambda: bind(self.svc))
        if not svc.settings.ready_siblings:
            self.registry.early = None
        self.sandboxes: Sandboxes | None = None  # the sandbox workers of the drive under way
        # False: the sandbox state goes to moto's own ECS integration (a test of the cloud
        # path under `mock_aws` plays the Fargate task itself).
        self.local_sandboxes = local_sandboxes
        self.warm_sandboxes = warm_sandboxes  # None: a warm worker for runs with sandboxed agents
        self.definition = self.template.definition(
            lambda logical_id: f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{logical_id}", values=substitutions
        )
        # An execution the drive has continued from is dropped from the interpreter, its
        # history too, once the next one runs: a drive holds one execution's state, so its
        # memory is bounded by its window, not by its run. `keep_histories` keeps them all
        # (to read every execution's `history` after the drive); `on_retire` is shown each
        # history just before it is dropped.
        self.keep_histories = False
        self.on_retire: Callable[[str, list[dict[str, Any]]], None] | None = None

    @property
    def state_machine_arn(self) -> str:
        digest = hashlib.sha256(self.definition.encode()).hexdigest()[:12]
        with _registry_lock:
            arn = self._machines.get(digest)
            # moto's backends are reset when a `mock_aws` context exits: make it again then.
            if arn is not None and not any(m.arn == arn for m in _backend().state_machines):
                arn = None
            if arn is None:
                machine = _backend().create_state_machine(
                    name=f"laneflow-flow-{digest}", definition=self.definition, roleArn=ROLE
                )
                arn = self._machines[digest] = machine.arn
        return arn

    def drive(self, tenant: str, run_id: str, *, on_tick: Callable[[], None] | None = None, tick_s: float = 0.1) -> DriveResult:
        """Run one drive of a run to its end (blocking), following it into each fresh
        execution it continues in (NextDrive), and return the run as stored. The run's
        secrets are masked for the whole drive (read once, not by each handler), and dropped
        with it unless other work of the run here still holds them."""
        with masking_of(self.svc, tenant, run_id):
            return self._drive(tenant, run_id, on_tick=on_tick, tick_s=tick_s)

    def _drive(self, tenant: str, run_id: str, *, on_tick: Callable[[], None] | None, tick_s: float) -> DriveResult:
        self._start_step_workers()  # first: they import while this process imports moto and parses the definition
        install_interpreter_hook()
        machine = self.state_machine_arn
        name = f"{run_id}-{_secrets.token_hex(4)}"
        # Known before it starts (moto names it so), since its first state calls a handler at once.
        arn = execution_arn(machine, name)
        self.continuations.follow(run_id, arn)
        self.serve(arn)
        try:
            self._start_sandboxes(arn, tenant, run_id)
            try:
                execution = _backend().start_execution(
                    machine, name=name, execution_input=json.dumps({"tenant": tenant, "run_id": run_id})
                )
                if execution.execution_arn != arn:  # pragma: no cover - guarded by test_engine_patch
                    raise RuntimeError(f"moto named the execution {execution.execution_arn}, not {arn}")
                execution = self._follow(run_id, execution, on_tick, tick_s)
            except KeyboardInterrupt:
                self._leave(tenant, run_id)
                raise
            status = str(execution.status)
            if status != "SUCCEEDED":
                close_run(self.svc, tenant, run_id, error=str(execution.error or status), cause=str(execution.cause or ""))
            if on_tick:
                on_tick()
            return DriveResult(
                store=self.svc.store,
                tenant=tenant,
                run_id=run_id,
                execution_arn=execution.execution_arn,
                execution_status=status,
                error=execution.error,
                cause=execution.cause,
                executions=self.continuations.chain(run_id),
            )
        finally:
            for each in self.continuations.done(run_id) or [arn]:
                serve_execution(each, None)
                with _registry_lock:
                    _sandboxes.pop(each, None)
            if self.sandboxes is not None:
                self.sandboxes.close()
                self.sandboxes = None

    def _follow(self, run_id: str, execution: Any, on_tick: Callable[[], None] | None, tick_s: float) -> Any:
        """Wait for the execution to end; if it continued in a fresh one, wait for that too,
        and so on: the drive's last execution."""
        while True:
            while execution.status == "RUNNING":
                if on_tick:
                    on_tick()
                time.sleep(tick_s)
            following = self.continuations.after(run_id, execution.execution_arn)
            if following is None or str(execution.status) != "SUCCEEDED":
                return execution
            serve_execution(execution.execution_arn, None)  # its handlers have all returned
            ended, execution = execution.execution_arn, self._execution(following)
            self._retire(ended)

    @staticmethod
    def _execution(arn: str) -> Any:
        for machine in _backend().state_machines:
            for execution in machine.executions:
                if execution.execution_arn == arn:
                    return execution
        raise RuntimeError(f"the interpreter has no execution {arn}")

    def serve(self, arn: str) -> None:
        """Answer the execution's Lambda calls (and its sandboxed steps) with this drive's."""
        serve_execution(arn, self.registry)
        if self.sandboxes is not None:
            with _registry_lock:
                _sandboxes[arn] = self.sandboxes

    def _start_step_workers(self) -> None:
        """This engine's step workers (LANEFLOW_STEP_WORKERS), shared by every engine of the
        process with the same services; they start in the background and take calls once ready."""
        size = self.svc.settings.step_workers
        if size < 1 or self.registry.step_workers is not None or not step_workers.usable(self.svc.store.url):
            return
        self.registry.step_workers = step_workers.shared(child_environ(self.svc), size, self.svc.callbacks)

    def _start_sandboxes(self, arn: str, tenant: str, run_id: str) -> None:
        """The sandbox workers of this drive, for the ECS hook to start children with."""
        if not self.local_sandboxes:
            return
        # A run with sandboxed agents gets a warm worker at once, ready by its first step.
        warm = self.warm_sandboxes
        if warm is None:
            warm = bool(sandboxed_agents(self.svc.store.get_run(tenant, run_id, steps=False).options))
        self.sandboxes = Sandboxes(self.svc.callbacks, child_environ(self.svc), warm=warm)
        with _registry_lock:
            _sandboxes[arn] = self.sandboxes

    def _retire(self, arn: str) -> None:
        """An execution the drive continued from, now that the next one runs: shown to
        `on_retire`, then forgotten (unless `keep_histories`)."""
        if self.keep_histories:
            return
        if self.on_retire is not None:
            self.on_retire(arn, self.history(arn))
        self.forget(arn)
        release_free_memory()

    def forget(self, execution_arn: str) -> None:
        """Drop an ended execution (its history too) from the interpreter: a long-lived
        process keeps nothing of the drives it has finished."""
        moto_patches.forget(_backend(), execution_arn)

    def _leave(self, tenant: str, run_id: str) -> None:
        """This worker is going away (SIGINT, SIGTERM): the run stays resumable. No handler
        starts any more; the running ones see it as a stop, end their model calls and mark
        their attempts interrupted themselves (with what they spent); then whatever attempt
        of this process is still running is interrupted by exact identity, and the drive is
        ended."""
        self.svc.leaving.set()
        if self.registry.step_workers is not None:
            self.registry.step_workers.leave()  # their running steps see it as the ones here do
        if self.sandboxes is not None:
            self.sandboxes.stop_all()  # their attempts read as gone once their processes are
        self.registry.wait_idle(LEAVE_WAIT_S)
        worker = current_worker()
        leave_drive(self.svc, tenant, run_id, worker, Liveness(gone=worker))

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        """The execution's history events, AWS-shaped (for tests and the store-cost benchmark)."""
        events: list[dict[str, Any]] = _backend().get_execution_history(execution_arn)["events"]
        return events


# The C heap of a long-lived process that drives runs (glibc's malloc; elsewhere these do
# nothing). What `serve` holds after a drive is what the drive left: nothing, once it is
# forgotten. What it had freed still sat in malloc's heaps, in two ways:
# - glibc gives a thread that finds no free arena a new one, up to 8 per core, and never
#   gives one back; moto's interpreter starts threads for executions, Map iterations and
#   timed states, so the process spread its allocations over every arena, each keeping the
#   free memory of its own busiest moment. The threads run Python one at a time (the GIL),
#   so more arenas bought no speed: `MALLOC_ARENAS` at most.
# - a drive's busiest moment touches pages of a heap that later hold nothing; they stayed
#   resident until a later drive reused them. The free pages are handed back once a drive
#   ended (`malloc_trim`, ~1 ms): nothing in use is touched, so a drive that left something
#   behind still shows.
# Together they took `serve`'s creep from ~1.5 MiB per 1,000 steps to noise (bench/serve_memory.py).
MALLOC_ARENAS = 2

_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def _glibc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # pragma: no cover - no C library to load
        return None


def bound_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap this process's malloc arenas (True if it took). It holds for the arenas made
    from now on, so it is set before the drives' threads start; a MALLOC_ARENA_MAX in the
    environment, read by glibc at start, is left to stand."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in environ():
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def release_free_memory() -> bool:
    """Hand malloc's free pages back to the system (True if any were)."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


class LocalDrives:
    """Starts drives on threads of this process (`laneflow serve`): each runs the embedded
    engine to the drive's end, and then forgets its execution. At most `pool` drives run at
    once (LANEFLOW_LOCAL_DRIVES); a drive started past that waits for a free place, holding
    nothing. Drives run at once, so a slow run never holds a quick one. The threads are
    daemons: a person's Ctrl-C ends the process, and reconcile takes over what was driving.
    A long-lived process stays flat: nothing of an ended drive is kept (`LocalEngine.forget`),
    its malloc arenas are capped (`bound_malloc_arenas`) and what a drive freed is handed back
    (`release_free_memory`)."""

    def __init__(self, engine: Callable[[], LocalEngine], pool: int = 4):
        if pool < 1:
            raise ValueError(f"a pool of {pool} drives runs nothing")
        bound_malloc_arenas()
        self.engine = engine
        self.pool = pool
        self._places = threading.BoundedSemaphore(pool)
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, tenant: str, run_id: str) -> str:
        """Drive the run on a thread; a run this process is already driving, or waiting to
        (for a place), is not started twice (a periodic reconcile sees a run still queued)."""
        name = f"local-drive-{run_id}"
        with self._lock:
            self.threads = [t for t in self.threads if t.is_alive()]
            if any(t.name == name for t in self.threads):
                return name
            thread = threading.Thread(target=self._drive, args=(tenant, run_id), name=name, daemon=True)
            self.threads.append(thread)
            thread.start()
        return name

    def _drive(self, tenant: str, run_id: str) -> None:
        with self._places:
            try:
                engine = self.engine()
                result = engine.drive(tenant, run_id)
                self._forget(engine, result)
                del engine, result
                release_free_memory()
            except Exception:  # reconcile picks up a drive that failed to run
                logging.getLogger("laneflow.engine").exception("local drive of %s failed", run_id)

    def _forget(self, engine: LocalEngine, result: DriveResult) -> None:
        """Drop the drive's executions from the interpreter, now that they ended (those it
        continued from went as the next ran, unless the engine keeps histories)."""
        ended = result.executions or [result.execution_arn]
        for arn in ended if engine.keep_histories else ended[-1:]:
            engine.forget(arn)

    def join(self, timeout: float | None = None) -> None:
        with self._lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout)
