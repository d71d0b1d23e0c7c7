"""The sandbox worker: runs one sandboxed step whole (its model loop and its tools) and
completes the state machine's task token with the step's report.

`python -m laneflow.entrypoints.sandbox_worker` is what the Fargate task runs in the cloud
(template.yaml's SandboxTaskDefinition) and what the embedded engine starts locally, as a
child process, for the same state of the same definition (`ecs:runTask.waitForTaskToken`).
What it is given, as environment variables (the state's container overrides):
- `LANEFLOW_TASK_TOKEN`: the state's task token;
- `LANEFLOW_STEP_REQUEST`: the state's input as JSON (a `RunStepRequest`, as the RunStep
  function is given it);
- `LANEFLOW_OP_EXECUTION`, `LANEFLOW_OP_STATE`, `LANEFLOW_OP_RETRY`: where it comes from in
  the orchestrator (the claim journal's operation id, as for RunStep);
- `LANEFLOW_RELAY` (local only): the engine's socket its callbacks go through, since the
  engine's interpreter is in another process. Its closing means the engine is gone: the
  worker leaves at once, recording nothing (`engine_gone`).
It runs the same `run_step` use case as the RunStep function, with its own worker
reference (the Fargate task, else this process), heartbeats while it runs, and ends with
send-task-success (the report the RunStep function returns) or send-task-failure (the
exception's name, which the definition retries and catches by, as for a Lambda).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any, NoReturn

log = logging.getLogger("laneflow.sandbox")

HEARTBEAT_S = 30.0  # well inside the state's HeartbeatSeconds (120)

SIGTERM_GRACE_S = 20.0  # inside ECS's default stop timeout (30 s)


def request_of(environ: Mapping[str, str]) -> Any:
    """The step request the state passed, with its operation context."""
    from laneflow.domain.messages import OpContext, RunStepRequest

    req = RunStepRequest.model_validate_json(environ["LANEFLOW_STEP_REQUEST"])
    raw = json.loads(environ["LANEFLOW_STEP_REQUEST"])
    op = OpContext(
        execution=environ.get("LANEFLOW_OP_EXECUTION", ""),
        state=environ.get("LANEFLOW_OP_STATE", ""),
        map_index=raw.get("map_index"),
        retry=int(environ.get("LANEFLOW_OP_RETRY") or 0),
    )
    return req.model_copy(update={"op": op})


def worker_of(environ: Mapping[str, str]) -> Any:
    """This worker's reference: the Fargate task (from ECS's task metadata, or
    `LANEFLOW_WORKER_TASK_ARN`), else this local process."""
    from laneflow.adapters.workers import local_worker
    from laneflow.domain.workers import FargateTask

    if environ.get("LANEFLOW_WORKER_TASK_ARN"):
        return FargateTask(task=environ["LANEFLOW_WORKER_TASK_ARN"], cluster=environ.get("LANEFLOW_WORKER_CLUSTER") or None)
    metadata = environ.get("ECS_CONTAINER_METADATA_URI_V4")
    if metadata:
        with urllib.request.urlopen(f"{metadata}/task", timeout=5) as response:  # ECS's own endpoint
            task = json.loads(response.read())
        return FargateTask(task=task["TaskARN"], cluster=task.get("Cluster"))
    return local_worker()


class _Heartbeat:
    """Tells the waiting state this worker is alive, every `every_s`, until stopped."""

    def __init__(self, callbacks: Any, token: str, every_s: float):
        self.callbacks, self.token, self.every_s = callbacks, token, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="sandbox-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.callbacks.heartbeat(self.token)
            except Exception as error:  # a missed beat is not the step's failure
                log.warning("heartbeat failed: %s", error)

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()


ENGINE_GONE_EXIT = 75  # what a local worker whose engine went away exits with, if it is not killed first


def engine_gone() -> NoReturn:
    """Locally: this worker's engine went away (its relay closed: `laneflow run` was killed,
    even by SIGKILL). Interrupted, never failed: the attempt is left as it stands, running
    with this worker's reference, for reconcile to find this process gone, mark the attempt
    interrupted and resume it; no token this worker completes is waited on any more. So
    nothing more of this worker may run, mid-model-call or mid-write as it may be (a store
    write that had not landed never does; one that had, a completion among them, stands).

    It stops itself whole (SIGSTOP: every thread at once), and a process it forks just
    before ends the programs its tools started (each in a process group of its own, which
    the worker's end does not reach; bubblewrap's would die with it anyway), then the
    worker. In that order: a program ended while the worker still ran would be heard by its
    step, which could go on to record the tool's result and even complete."""
    worker = os.getpid()
    try:
        ender = os.fork()
    except OSError:
        os._exit(ENGINE_GONE_EXIT)
    if ender == 0:
        _end_stopped_worker(worker)
    os.kill(worker, signal.SIGSTOP)
    os._exit(ENGINE_GONE_EXIT)  # continued after all (its ender failed): it leaves anyway


def _end_stopped_worker(worker: int) -> NoReturn:
    """In the process `engine_gone` forked: once the worker has stopped, end the programs it
    started, then the worker."""
    try:
        deadline = time.monotonic() + 2.0
        while _state(worker) not in ("T", None) and time.monotonic() < deadline:
            time.sleep(0.001)
        me = os.getpid()
        for pid in _children_of(worker):
            if pid == me:
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(worker, signal.SIGKILL)
        os._exit(0)


def _stat(pid: int) -> list[bytes] | None:
    """A process's /proc stat fields after its name (state first, then its parent), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0].decode() if fields else None


def _children_of(parent: int) -> list[int]:
    """The processes `parent` started that are still its own."""
    mine = str(parent).encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and len(fields) > 1 and fields[1] == mine:
                found.append(int(entry.name))
    return found


def watch_parent(parent: int) -> None:
    """Locally: a worker whose engine went away (even by SIGKILL) ends too, at once (the
    sandbox workers, and the engine's step workers)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(70)

    threading.Thread(target=watch, name="sandbox-parent-watch", daemon=True).start()


def run(environ: Mapping[str, str]) -> int:
    """Run the step the environment names and complete its token. 0 when the token was
    completed (success or failure), 1 when even that failed."""
    from laneflow.ports import TokenGone
    from laneflow.usecases.run_step.runner import run_step
    from laneflow.wiring import sandbox_services

    token = environ["LANEFLOW_TASK_TOKEN"]
    svc = sandbox_services(environ, engine_gone=engine_gone)
    try:
        with _Heartbeat(svc.callbacks, token, float(environ.get("LANEFLOW_HEARTBEAT_S") or HEARTBEAT_S)):
            try:
                report = run_step(svc, request_of(environ), worker_of(environ))
            except Exception as error:  # crosses as the task's failure, by its name
                log.exception("the sandboxed step failed")
                svc.callbacks.fail(token, type(error).__name__, svc.redactor(str(error))[:32000])
                return 0
        svc.callbacks.succeed(token, report.model_dump(mode="json"))
        return 0
    except TokenGone as gone:
        log.warning("the state no longer waits for this step (%s)", gone)
        return 0
    except Exception:  # the state times out on its heartbeat and catches it
        log.exception("could not complete the task token")
        return 1
    finally:
        svc.store.close()


def _private_scratch() -> None:
    """As root, this worker's attempts' scratch copies go on a tmpfs of its own, sized to the
    step's `size:` (a write past it fails); elsewhere they are measured (isolation.py)."""
    from laneflow.adapters.aws.s3 import ATTEMPTS, own_folder
    from laneflow.adapters.executors.isolation import private_scratch

    private_scratch(own_folder(ATTEMPTS))  # the tmpfs goes over this user's own folder, never another's


def _on_sigterm(grace_s: float) -> None:
    """ECS StopTask (a person stopped the run) sends SIGTERM, then SIGKILL after the
    container's stop timeout (30 s). The step sees its run's stop at its next check and ends
    its attempt `stopped` itself, completing its token; if it has not within `grace_s`, the
    worker exits, and the state's heartbeat timeout and reconcile end the attempt."""

    def handler(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: ending within %.0f s", grace_s)
        timer = threading.Timer(grace_s, os._exit, args=(143,))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, handler)


# -- the warm worker (locally) -------------------------------------------------------------------


def _preload() -> None:
    """What every step needs, imported once by the warm worker before it forks (Powertools'
    tracer alone takes about 0.3 s to import, boto3 about 0.1 s)."""

    import laneflow.adapters.aws.powertools  # the services' telemetry
    import laneflow.adapters.executors.stub
    import laneflow.usecases.run_step.runner
    import laneflow.wiring  # noqa: F401


def _forked(environ: dict[str, str]) -> None:
    """In a worker forked for one step: its own session, environment and caches, then run."""
    import random

    from laneflow.adapters.workers import local_worker
    from laneflow.settings import settings

    os.setsid()  # its own process group: a stop kills all it started
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the warm worker's requests are not this worker's
    os.dup2(2, 1)  # nor are its answers: this worker's output goes to stderr
    sys.argv = sys.argv[:1]
    # This fork is a process of its own, set up here as its main: its environment is the
    # step's whole environment (nothing of the warm worker's), and what was read from the
    # warm worker's is read again.
    os.environ.clear()
    os.environ.update(environ)
    local_worker.cache_clear()  # this process, not the warm worker
    settings.cache_clear()
    random.seed()
    code = 1
    try:
        code = main()
    finally:
        logging.shutdown()
        os._exit(code)


def zygote() -> int:
    """The warm worker: imports laneflow once, then forks one sandbox worker per request.

    Reads one JSON line per step on stdin (`{"env": {...}}`: the step's whole environment)
    and answers `{"pid": N}`; tells `{"exit": N, "code": C}` when a worker ends. It ends when
    its stdin closes (the engine is done) or its engine goes away. Starting a Python that
    imports laneflow costs about 0.4 s on a small machine; a fork of this one, milliseconds."""
    _preload()
    watch_parent(os.getppid())
    out_lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def reap() -> None:
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                time.sleep(0.05)
                continue
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    threading.Thread(target=reap, name="zygote-reap", daemon=True).start()
    say({"ready": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _forked(request["env"])
        say({"pid": pid})
    return 0


def main() -> int:
    if sys.argv[1:] == ["--zygote"]:
        return zygote()
    from laneflow.settings import environ

    env = environ()  # the process's main: the step it runs is named by its whole environment
    logging.basicConfig(level=env.get("POWERTOOLS_LOG_LEVEL") or "WARNING", stream=sys.stderr)
    _private_scratch()  # before any thread starts: it makes a mount namespace of its own
    if env.get("LANEFLOW_RELAY"):
        watch_parent(os.getppid())
    else:
        _on_sigterm(SIGTERM_GRACE_S)
    return run(env)


if __name__ == "__main__":
    sys.exit(main())
