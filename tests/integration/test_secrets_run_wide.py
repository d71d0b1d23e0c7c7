"""Masking is run-wide, on both stores: every value any agent of a run's flow declares (and the
model's key) is masked in every record of the run from its first write, whichever step holds
it, and in its common encodings.

One flow puts a declared value everywhere a run records something:
- the run's input (started through the API, and through `laneflow run`), a flow instruction
  (so the flow snapshot and the step's message), a placeholder filled from the input;
- `keeper` declares TOKEN; its program writes the value into storage/ and prints it in
  base64 and hex;
- `reader` declares nothing: it reads the kept file with `read_file`, makes a pretend tool
  call with encoded copies, and replies with the value and every encoding (whole, inside a
  longer base64 stream at each alignment);
- `failer` declares nothing and fails with the value in its reason, which ends the run
  failed: the run's error and the on-end event hold it.
Then every stored byte is searched (the SQLite file and its WAL or every DynamoDB item and S3
object, the captures, events.jsonl), and so are `laneflow show`, `show --json`, the API's run
JSON, the log records and the CLI's stderr. Each search has its control: the mark `[TOKEN]`
is found where the raw value was produced (the kept file itself holds the raw value), so a
search that finds nothing found nothing because the value was masked."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, data_of, drive, read_capture, stored_bytes, write_workspace

from laneflow.adapters.executors.stub import StubExecutor
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.records import EventType, Run, RunStatus, StepStatus
from laneflow.domain.redaction import encodings
from laneflow.entrypoints.api import resolve
from laneflow.entrypoints.cli import main
from laneflow.ports import ExecutionSink, Services, StepJob, StepOutcome
from laneflow.settings import settings
from laneflow.wiring import local_engine

# A value with what each encoding changes: a space, `/`, `+`, a quote, a backslash, non-ASCII.
TOKEN = 'Tök/+ "quoted" \\ run-wide 0123456789'
KEY = "sk-ant-run-wide-model-key-0123456789"

FORMS = [form for form in encodings(TOKEN) if len(form) >= 8]
KEY_FORMS = [form for form in encodings(KEY) if len(form) >= 8]


def in_stream(value: str, before: bytes, after: bytes, *, url: bool = False) -> str:
    """`value`'s bytes inside a longer base64 stream (`before` sets the alignment)."""
    encode = base64.urlsafe_b64encode if url else base64.b64encode
    return encode(before + value.encode() + after).decode()


EMBEDDED = [in_stream(TOKEN, b"x" * k, b"tail", url=url) for k in (0, 1, 2) for url in (False, True)]


def dotenv(tmp_path: Path, **values: str) -> Path:
    """A dotenv file inside the workspace's folder (stored_bytes leaves `ws/` out)."""
    path = tmp_path / "ws" / "given.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    quoted = {name: value.replace("\\", "\\\\").replace('"', '\\"') for name, value in values.items()}
    path.write_text("".join(f'{name}="{value}"\n' for name, value in quoted.items()))
    return path


def workspace(tmp_path: Path) -> Path:
    keep = 'mkdir -p storage && printf %s "$TOKEN" > storage/kept.txt && printf %s "$TOKEN" | base64 -w0 && echo && printf %s "$TOKEN" | od -An -tx1 | tr -d " \\n"'
    reply = "\n".join([f"Read {TOKEN} and {KEY}.", *FORMS, *KEY_FORMS, *EMBEDDED])
    agents: dict[str, dict[str, Any]] = {
        "keeper": {"secrets": ["TOKEN"], "tools": ["bash"], "stub": f"tool: bash {json.dumps({'command': keep})}\n===\nKept it."},
        "reader": {
            "tools": ["read_file"],
            "stub": f'tool: read_file {{"path": "storage/kept.txt"}}\ncall: lookup {FORMS[1]} => {FORMS[-1]}\n===\n{reply}',
        },
        "failer": {"stub": f"fail: refused {TOKEN}"},
    }
    flow: dict[str, Any] = {
        "steps": [
            {"agent": "keeper", "instruction": f"Keep {TOKEN} in storage.", "retries": 0},
            {"agent": "reader", "instruction": "Read what was kept about {input.note}.", "retries": 0},
            {"agent": "failer", "instruction": f"Refuse {base64.b64encode(TOKEN.encode()).decode()}.", "retries": 0},
        ]
    }
    return write_workspace(tmp_path / "ws", agents, {"everywhere": flow})


RUN_INPUT = {
    "note": TOKEN,
    "key": KEY,
    "encoded": {"b64": base64.b64encode(TOKEN.encode()).decode(), "hex": TOKEN.encode().hex()},
}


def leaks(text: str | bytes) -> list[str]:
    """Every form of the declared value or the model's key found in `text`."""
    data = text.encode() if isinstance(text, str) else text
    return [form for form in FORMS + KEY_FORMS if form.encode() in data]


def api_get(svc: Services, path: str, tenant: str) -> Any:
    event = {
        "resource": path,
        "path": path,
        "httpMethod": "GET",
        "headers": {},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "body": None,
        "isBase64Encoded": False,
        "requestContext": {
            "httpMethod": "GET",
            "path": "/Prod" + path,
            "resourcePath": path,
            "stage": "Prod",
            "requestId": "req-1",
            "identity": {"accountId": tenant, "sourceIp": "198.51.100.7"},
        },
    }
    out = resolve(event, None, svc)
    assert out["statusCode"] == 200, out
    return out["body"]


class DriveHere:
    """The API's DriveStarter: drives the run on the embedded engine there and then."""

    def __init__(self, svc: Services) -> None:
        self.engine = local_engine(svc)

    def start(self, tenant: str, run_id: str) -> str:
        self.engine.drive(tenant, run_id, tick_s=0.02)
        return "drive-1"


def api_start(svc: Services, tmp_path: Path, tenant: str) -> Run:
    svc.workspaces = FolderWorkspaces(tmp_path)
    svc.drives = DriveHere(svc)
    body = json.dumps({"workspace": "ws", "flow": "everywhere", "input": RUN_INPUT})
    event = {
        "resource": "/runs",
        "path": "/runs",
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "body": body,
        "isBase64Encoded": False,
        "requestContext": {
            "httpMethod": "POST",
            "path": "/Prod/runs",
            "resourcePath": "/runs",
            "stage": "Prod",
            "requestId": "req-1",
            "identity": {"accountId": tenant, "sourceIp": "198.51.100.7"},
        },
    }
    out = resolve(event, None, svc)
    assert out["statusCode"] == 201, out
    return svc.store.get_run(tenant, json.loads(out["body"])["id"])


def check_records(svc: Services, run: Run, ws: Path) -> None:
    """Where the value was produced, the record holds its mark (the controls of the searches)."""
    assert (ws / "storage" / "kept.txt").read_text() == TOKEN  # the raw value was really kept
    assert run.status == RunStatus.failed, run.error
    keeper, reader, failer = run.steps
    assert (keeper.status, reader.status, failer.status) == (StepStatus.completed, StepStatus.completed, StepStatus.failed)
    assert run.input["note"] == "[TOKEN]" and run.input["key"] == "[ANTHROPIC_API_KEY]"
    assert run.input["encoded"] == {"b64": "[TOKEN]", "hex": "[TOKEN]"}
    assert keeper.instruction == "Keep [TOKEN] in storage." and reader.instruction == "Read what was kept about [TOKEN]."
    assert "[TOKEN]" in json.dumps(run.flow_spec)
    # The step that declares nothing: its read of the kept file, its pretend call, its reply.
    tools = {e.text.split()[0]: read_capture(svc, data_of(e)["capture"]) for e in reader.events if e.type == EventType.tool}
    assert tools["read_file"]["output"] == "[TOKEN]"
    assert (tools["lookup"]["input"], tools["lookup"]["output"]) == ("[TOKEN]", "[TOKEN]")
    assert reader.result is not None and reader.result.startswith("Read [TOKEN] and [ANTHROPIC_API_KEY].\n")
    assert reader.result.count("[TOKEN]") >= len(FORMS) + len(EMBEDDED)
    [program] = [e for e in keeper.events if e.type == EventType.tool]
    assert "--- stdout ---\n[TOKEN]\n[TOKEN]\n" in read_capture(svc, data_of(program)["capture"])["output"]  # base64, hex
    assert "refused [TOKEN]" in (failer.error or "") and "[TOKEN]" in (run.error or "")
    assert not leaks(run.model_dump_json())
    # The run has ended: nothing of its values is held any more.
    assert svc.redactor.held() == [] and svc.redactor(TOKEN) == TOKEN


class LogLines(logging.Handler):
    """Every record this process's loggers make while it is open (the root's and laneflow's,
    whose own handler does not propagate), at every level, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []
        self.loggers = {logger: logger.level for logger in (logging.getLogger(), logging.getLogger("laneflow"))}
        for logger in self.loggers:
            logger.setLevel(logging.DEBUG)
            logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def close(self) -> None:
        for logger, level in self.loggers.items():
            logger.removeHandler(self)
            logger.setLevel(level)
        super().close()


class LoudStub:
    """The stub executor, logging what each step said before it is recorded: a log line made
    mid-run with the raw value in it (the control of the logs' search)."""

    name = "stub"

    def __init__(self) -> None:
        self.inner = StubExecutor()

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        outcome = self.inner.execute(job, sink)
        logging.getLogger("laneflow.tests.loud").info("step %s said: %s", job.agent, outcome.result)
        return outcome


@pytest.fixture
def no_machine_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TOKEN", raising=False)
    monkeypatch.setenv("LANEFLOW_SECRETS_FILE", "")
    settings.cache_clear()
    yield
    settings.cache_clear()


def test_every_record_of_a_run_is_masked_with_every_declared_value_in_every_encoding(
    on: ServicesOn, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_machine_secrets: None
) -> None:
    # Given a flow whose one agent declares TOKEN, and a value in every place a run records,
    ws = workspace(tmp_path)
    svc = on(LANEFLOW_SECRETS_FILE=str(dotenv(tmp_path, TOKEN=TOKEN)), ANTHROPIC_API_KEY=KEY)
    svc.executors["stub"] = LoudStub()
    said = LogLines()
    # When the run is started through the API and driven to its end,
    run = api_start(svc, tmp_path, "local")
    # then each record holds the mark where the value was,
    check_records(svc, run, ws)
    (events,) = [p for p in tmp_path.rglob("events.jsonl")]
    assert "[TOKEN]" in events.read_text()  # the on-end event's error
    # and no form of the value is anywhere: the store, its WAL, the captures, the on-end event,
    assert leaks(stored_bytes(on.kind, tmp_path)) == []
    # the API's run JSON,
    answered = api_get(svc, f"/runs/{run.id}", run.tenant)
    assert "[TOKEN]" in answered and leaks(answered) == []
    # the log records (laneflow's, at every level),
    said.close()
    assert any(line.startswith("laneflow.tests.loud INFO step reader said: Read [TOKEN]") for line in said.lines)
    assert leaks("\n".join(said.lines)) == []
    # and `laneflow show`, as text and as JSON.
    store = str(svc.store.url) if on.kind == "dynamodb" else f"sqlite:///{tmp_path / 'laneflow.db'}"
    capsys.readouterr()
    for extra in ([], ["--json"]):
        assert main(["show", run.id, "--store", store, *extra]) == 0
        out = capsys.readouterr()
        assert "[TOKEN]" in out.out and leaks(out.out + out.err) == [], extra


def test_laneflow_run_masks_the_run_from_its_start_and_says_nothing_of_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_machine_secrets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # the model's key of this machine: masked too
    settings.cache_clear()
    ws = workspace(tmp_path)
    given = dotenv(tmp_path, TOKEN=TOKEN)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    code = main(
        ["run", str(ws), "everywhere", "--store", store, "--secrets", str(given), "--input", json.dumps(RUN_INPUT), "--json"]
    )
    out = capsys.readouterr()
    assert code == 1, out.err
    shown = json.loads(out.out)
    assert shown["input"]["note"] == "[TOKEN]" and shown["steps"][1]["result"].startswith("Read [TOKEN]")
    assert leaks(out.out + out.err) == []
    assert leaks(stored_bytes("sqlite", tmp_path)) == []


def test_a_value_not_set_when_the_run_starts_is_no_error_then_and_the_declaring_step_fails_as_before(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on(LANEFLOW_SECRETS_FILE=str(dotenv(tmp_path)))
    ws = write_workspace(
        tmp_path / "ws",
        {"quiet": {"stub": "Done."}, "needy": {"secrets": ["ABSENT"], "stub": "Never."}},
        {"two": {"steps": [{"agent": "quiet"}, {"agent": "needy", "retries": 2}]}},
    )
    run = drive(svc, ws, "two")
    assert run.options["secrets"] == ["ABSENT"]  # the names are kept with the run, never a value
    assert [s.status for s in run.steps] == [StepStatus.completed, StepStatus.failed]
    assert run.steps[1].error == "secret ABSENT is not set (declared by agent needy)" and run.steps[1].attempts == 1


def test_a_source_that_cannot_be_read_refuses_the_start_and_writes_nothing(on: ServicesOn, tmp_path: Path) -> None:
    svc = on(LANEFLOW_SECRETS_FILE=str(tmp_path / "ws" / "nowhere.env"))
    ws = workspace(tmp_path)
    with pytest.raises(Exception, match="does not exist"):
        drive(svc, ws, "everywhere", RUN_INPUT)
    assert svc.store.list_runs("local") == [] and svc.redactor.held() == []
