"""What several test files share that is not a fixture: where things are in the checkout,
the moto helper the engine's threads need against moto's DynamoDB, services on either
store (`services_on`, behind conftest's `on` fixture), a stub workspace written from
dicts, one drive through the real definition, and every byte a run left stored.

Importable as `helpers` from every test (pyproject's pytest `pythonpath` puts `tests/` on the
path); tests/conftest.py keeps only fixtures and hooks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import boto3
import pytest
import yaml
from moto import mock_aws

from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.domain.records import Attempt, Event, EventType, ModelCall, Run, Step
from laneflow.domain.workers import LocalProcess
from laneflow.ports import Services, StepInbox, StepJob
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

# The engine's threads against moto's DynamoDB (see laneflow_dev/moto_support.py).
from laneflow_dev.moto_support import serialized_dynamodb as moto_dynamodb_serialized

if TYPE_CHECKING:
    from laneflow.adapters.engine.local import DriveResult, LocalEngine

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLES = ROOT / "examples"

DYNAMODB_TABLE, DYNAMODB_BUCKET, DYNAMODB_REGION = "laneflow-runs", "laneflow-blobs", "us-east-1"
DYNAMODB = f"dynamodb://{DYNAMODB_TABLE}?bucket={DYNAMODB_BUCKET}&region={DYNAMODB_REGION}"

__all__ = [
    "DYNAMODB",
    "DYNAMODB_BUCKET",
    "DYNAMODB_REGION",
    "DYNAMODB_TABLE",
    "EXAMPLES",
    "FIXTURES",
    "ROOT",
    "data_of",
    "drive",
    "error_of",
    "local_pid",
    "message_of",
    "result_of",
    "spans_of",
    "stamped",
    "started_drives",
    "stderr_of",
    "moto_dynamodb_serialized",
    "services_on",
    "store_kinds",
    "stored_bytes",
    "wait_for",
    "write_workspace",
]


STORE_KINDS = ("sqlite", "dynamodb")


class ServicesOn(Protocol):
    """The `on` fixture: on(**env) -> Services on the store of the test's `store_kind`."""

    kind: str

    def __call__(self, **env: str) -> Services: ...


class FlowRunner(Protocol):
    """The `run_flow` fixture: run_flow(workspace, flow, input) -> DriveResult, on its `engine`."""

    engine: LocalEngine

    def __call__(self, workspace: str | Path, flow: str, run_input: Any = None, **kwargs: Any) -> DriveResult: ...


def store_kinds(config: pytest.Config) -> list[str]:
    """The stores `--store-backend` names: both (`all`, the default), or one. A test runs on
    them by taking the `store_kind` fixture (tests/conftest.py), directly or through one
    that does (`on`, the contract's `store`)."""
    chosen = str(config.getoption("store_backend"))
    return list(STORE_KINDS) if chosen == "all" else [chosen]


@contextmanager
def services_on(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[Services]:
    """Services on a fresh store of `kind`: a SQLite file, or DynamoDB and S3 under moto
    (the table from template.yaml). Captures and the on-end hook's events.jsonl go under
    tmp_path; `env` is the environment the settings are read from."""
    environ = {"LANEFLOW_CAPTURE_DIR": str(tmp_path / "captures"), **env}
    if kind == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'laneflow.db'}")
        try:
            yield for_store(store, Settings.from_env(environ))
        finally:
            store.close()
        return
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)  # no profile, region or endpoint of the person running the tests
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": DYNAMODB_REGION,
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws(), moto_dynamodb_serialized():
        init_store(DYNAMODB)
        store = open_store(DYNAMODB)
        # This process's clients are made: from here on the endpoint only reaches children (a
        # sandbox worker), through a moto server sharing the mock's state.
        from contract.store.backends import _moto_server_url

        monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_server_url())
        try:
            yield for_store(store, Settings.from_env({**environ, "LANEFLOW_STORE": DYNAMODB}))
        finally:
            store.close()


def drive(svc: Services, workspace: Path | str, flow: str, run_input: Any = None, **kwargs: Any) -> Run:
    """One run of `flow` through the real definition on the embedded engine, to its end."""
    run = create_run(svc, workspace, flow, run_input, **kwargs)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def write_workspace(
    root: Path, agents: dict[str, dict[str, Any]], flows: dict[str, dict[str, Any]], agents_md: str = "model: stub\n"
) -> Path:
    """A workspace on the stub model: agents as frontmatter, flows as YAML, AGENTS.md's
    frontmatter as given."""
    (root / "AGENTS.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "AGENTS.md").write_text(f"---\n{agents_md}---\nA workspace of the tests.\n")
    for name, settings in agents.items():
        folder = root / "agents" / name
        folder.mkdir(parents=True)
        (folder / "agent.md").write_text("---\n" + yaml.safe_dump(settings, sort_keys=False) + f"---\nYou are {name}.\n")
    (root / "flows").mkdir()
    for name, flow in flows.items():
        (root / "flows" / f"{name}.yaml").write_text(yaml.safe_dump(flow, sort_keys=False))
    return root


def pacing_workspace(root: Path, slow_ms: int) -> Path:
    """`root/ws_pace`: a one-step flow `slow` whose step takes `slow_ms`, and a one-step flow
    `quick` whose step does not wait; each step replies "<agent> done."."""
    agents = {agent: {"stub": f"delay_ms: {delay}\n{agent} done.\n"} for agent, delay in (("slow", slow_ms), ("quick", 0))}
    flows = {agent: {"description": f"one {agent} step", "steps": [{"agent": agent}]} for agent in ("slow", "quick")}
    return write_workspace(root / "ws_pace", agents, flows)


def stored_bytes(kind: str, tmp_path: Path) -> bytes:
    """Everything written: every file under tmp_path but the workspace `ws/` (the SQLite file
    and its WAL, the captures, events.jsonl, logs) and, for DynamoDB, every item of the
    table and every S3 object."""
    parts = [p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and "ws" not in p.relative_to(tmp_path).parts[:1]]
    if kind == "dynamodb":
        db = boto3.client("dynamodb", region_name=DYNAMODB_REGION)
        for page in db.get_paginator("scan").paginate(TableName=DYNAMODB_TABLE):
            parts.append(json.dumps(page["Items"], ensure_ascii=False).encode())
        s3 = boto3.client("s3", region_name=DYNAMODB_REGION)
        for listing in s3.get_paginator("list_objects_v2").paginate(Bucket=DYNAMODB_BUCKET):
            for obj in listing.get("Contents", []):
                parts.append(s3.get_object(Bucket=DYNAMODB_BUCKET, Key=obj["Key"])["Body"].read())
    return b"\n".join(parts)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closed the connection (None: still open after `seconds`)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - started


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 30, poll_s: float = 0.01) -> Any:
    """Poll `predicate` until it returns something true, and return that. `timeout_s` only
    keeps a broken test from hanging (it is generous, never the figure under test): past it
    the test fails saying `what` never happened."""
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"{what} never happened within {timeout_s:g} s"
        time.sleep(poll_s)
    return got


def wait_for_run(
    proc: Any, db_file: Path, store_url: str, ready: Callable[[Any, Run], bool], poll_s: float = 0.05, within_s: float = 90
) -> tuple[Any, str | None]:
    """While a `laneflow` subprocess runs, poll its store until its first run is `ready`
    (given the store and the run): (the store, the run's id), or (the store or None, None)
    if the process ended or `within_s` passed first."""
    db, deadline = None, time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        if db_file.exists():
            db = db or open_store(store_url)
            runs = db.list_runs("local")
            if runs and ready(db, runs[0]):
                return db, runs[0].id
        time.sleep(poll_s)
    return db, None


class Sink:
    """What an executor reports to, kept in memory (the store-backed sink is tested end to end)."""

    inbox: StepInbox | None  # declared for the ExecutionSink protocol; never set (no colleagues)

    def __init__(self, stop_after_s: float | None = None) -> None:
        self.events: list[tuple[str, str, dict[str, Any] | None]] = []
        self._stop_at = time.monotonic() + stop_after_s if stop_after_s is not None else None

    def event(self, type: EventType | str, text: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((str(type), text, data))

    def stopped(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at

    # The rest of ExecutionSink: what the tools and the call watch that use this sink never call.
    def first_event(self) -> None:
        raise AssertionError("not expected of this sink")

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:
        raise AssertionError("not expected of this sink")

    def begin_turn(self) -> None:
        raise AssertionError("not expected of this sink")

    def call(self, span: ModelCall) -> ModelCall:
        raise AssertionError("not expected of this sink")

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        raise AssertionError("not expected of this sink")


def step_job(ws: Path, **fields: Any) -> StepJob:
    """One attempt's job for the tools of agent `worker` in the workspace `ws` (fields override)."""
    base = dict(
        tenant="local",
        run_id="run-1",
        index=2,
        attempt=1,
        agent="worker",
        model="stub",
        item=None,
        run_input=None,
        system_stable="",
        system_dynamic="",
        user="",
        tools=("bash", "scripts"),
        workspace_root=str(ws),
        agent_path="agents/worker",
    )
    return StepJob(**{**base, **fields})


def read_capture(svc: Services, ref: str) -> dict[str, Any]:
    """A capture read back from the services' capture sink (FolderCaptures and S3Captures
    read one back; the port itself only writes)."""
    captures: Any = svc.captures
    record: dict[str, Any] = captures.get(ref)
    return record


# Narrowing a field that may be None before a test reads it: each asserts it is there, so a
# None fails the test with what was missing (the record's own repr), not with a TypeError.


def data_of(event: Event) -> dict[str, Any]:
    """An event's data (a tool event's name, capture, flags; a retry's `told`)."""
    assert event.data is not None, f"the event has no data: {event!r}"
    return event.data


def error_of(record: Step | Run) -> str:
    """A step's or a run's error, which a failed one has."""
    assert record.error is not None, f"no error recorded: {record!r}"
    return record.error


def message_of(step: Step) -> str:
    """The user message a step's latest attempt was sent."""
    assert step.message is not None, f"the step was sent no message: {step!r}"
    return step.message


def result_of(step: Step) -> str:
    """A step's result, which a step that replied has."""
    assert step.result is not None, f"the step has no result: {step!r}"
    return step.result


def local_pid(attempt: Attempt) -> int:
    """The process id of an attempt that ran in a local process (the engine's or a sandbox's)."""
    assert isinstance(attempt.worker, LocalProcess), f"not a local process: {attempt.worker!r}"
    return attempt.worker.pid


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """What a child started with `stderr=subprocess.PIPE` wrote to its stderr (to its end)."""
    assert proc.stderr is not None, "the child's stderr is not a pipe"
    return proc.stderr.read()


class _RecordsStarts(Protocol):
    started: list[Any]


def started_drives(svc: Services) -> list[Any]:
    """What the services' recording DriveStarter was asked to start, in order."""
    drives = svc.drives
    assert drives is not None and hasattr(drives, "started"), f"not a recording DriveStarter: {drives!r}"
    return cast("_RecordsStarts", drives).started


def stamped(stamps: Iterable[str | None]) -> list[str]:
    """Timestamps, each asserted set (of an attempt that ended, a step that started)."""
    given = list(stamps)
    found = [stamp for stamp in given if stamp is not None]
    assert len(found) == len(given), f"a timestamp is missing: {given}"
    return found


def spans_of(steps: Iterable[Step]) -> list[tuple[str, str]]:
    """Each step's (started_at, finished_at), in order of start; each asserted started and finished."""
    spans = [(step.started_at, step.finished_at) for step in steps]
    found = [(start, end) for start, end in spans if start is not None and end is not None]
    assert len(found) == len(spans), f"a step never started or finished: {spans}"
    return sorted(found)


def as_nobody(top: Path, work: Callable[[], Any], what: str = "the plain user's work") -> Any:
    """`work()` in a laneflow that is nobody (what a root machine has to be a plain user
    with): this process forked, the child made nobody for good first, `top` its own; what
    it returns comes back as JSON on a pipe."""
    from laneflow.adapters.executors.isolation import NOBODY

    os.chown(top, NOBODY, NOBODY)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(work()))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        said = answer.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and said, f"{what} did not finish"
    return json.loads(said)
