"""Declared secrets through the real definition on the embedded engine, on both stores:
- a step gets each declared secret (as a variable, `@NAME` as a 0600 file removed when the
  attempt ends, a model-named one as LANEFLOW_DECLARED_<NAME>, the trace saying why), and
  what it says back with a value in it is recorded masked;
- a secret that is not set fails the step before the model is called, never retried (the
  stub and Claude paths);
- a run's values are dropped when it ends;
- the cloud source: Secrets Manager under `laneflow/<tenant>/<NAME>` (moto), by the run's
  tenant only; the IAM that lets only the step runners read them;
- `laneflow run --secrets FILE`;
- captures: `capture: metadata` keeps no tool text anywhere; past the step's capture limit no
  later call is captured, and the trace says so once.

The stub executor cannot read its environment, so a test executor around it keeps each
job's `secret_env` (and a file's mode and text while the attempt runs): the window on what
the step's programs get; where the bash tool exists, a real program prints them back."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import ROOT, ServicesOn, data_of, drive, read_capture, services_on, stored_bytes, write_workspace
from pydantic import SecretStr

from laneflow.adapters.aws.secrets import SecretsManagerSecrets
from laneflow.adapters.engine.template import Template
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.executors.stub import StubExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.records import AttemptRef, AttemptStatus, EventType, FailureKind, RunStatus, StepStatus, utcnow
from laneflow.domain.redaction import STEP_CAPTURE_LIMIT
from laneflow.domain.tenants import TenantInvalid
from laneflow.entrypoints.cli import main
from laneflow.ports import ExecutionSink, Services, StepJob, StepOutcome
from laneflow.settings import Settings, settings
from laneflow.usecases.run_step.recorder import StepRecorder, capture_full, captured
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

TOKEN = "tok-0123456789-abcdef"
CERT = "-----BEGIN CERT----- c3VwZXIgc2VjcmV0 -----END CERT-----"
MODEL_NAMED = "sk-ant-for-the-script-000111"


class SeeingStub:
    """The stub executor, keeping what each job gave the step's programs: its `secret_env`,
    and for each value that is a file, its mode and text while the attempt runs."""

    name = "stub"

    def __init__(self) -> None:
        self.inner = StubExecutor()
        self.seen: list[tuple[str, dict[str, str], dict[str, tuple[int, str]]]] = []

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        files = {
            name: (stat.S_IMODE(os.stat(value).st_mode), Path(value).read_text())
            for name, value in job.secret_env.items()
            if value.startswith("/") and os.path.isfile(value)
        }
        self.seen.append((job.agent, dict(job.secret_env), files))
        return self.inner.execute(job, sink)


def seeing(svc: Services) -> SeeingStub:
    svc.executors["stub"] = executor = SeeingStub()
    return executor


def secrets_file(tmp_path: Path, **values: str) -> Path:
    """A dotenv file inside the workspace's folder (the grep of stored bytes leaves `ws/` out)."""
    path = tmp_path / "ws" / "given.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{name}="{value}"\n' for name, value in values.items()))
    return path


def fetcher_workspace(tmp_path: Path, secrets: list[str], stub: str, **step: Any) -> Path:
    return write_workspace(
        tmp_path / "ws",
        {"fetcher": {"secrets": secrets, "stub": stub}},
        {"fetch": {"steps": [{"agent": "fetcher", "instruction": "Fetch it.", **step}]}},
    )


# -- a step gets its secrets --------------------------------------------------------------------


def test_a_step_gets_its_secrets_as_variables_files_and_prefixed_names_and_its_reply_comes_back_masked(
    on: ServicesOn, tmp_path: Path
) -> None:
    given = secrets_file(tmp_path, TOKEN=TOKEN, CERT=CERT, ANTHROPIC_API_KEY=MODEL_NAMED)
    svc = on(LANEFLOW_SECRETS_FILE=str(given))
    executor = seeing(svc)
    ws = fetcher_workspace(
        tmp_path,
        ["TOKEN", "@CERT", "ANTHROPIC_API_KEY"],
        f'call: fetch {TOKEN} => {CERT}\n===\nGot {TOKEN} and {MODEL_NAMED}.\n```json\n{{"t": "{TOKEN}"}}\n```',
        output="json",
    )

    run = drive(svc, ws, "fetch")

    assert run.status == RunStatus.completed, run.error
    [(agent, env, files)] = executor.seen
    cert_path = env["CERT"]
    assert agent == "fetcher" and env == {"TOKEN": TOKEN, "CERT": cert_path, "LANEFLOW_DECLARED_ANTHROPIC_API_KEY": MODEL_NAMED}
    assert files == {"CERT": (0o600, CERT)}
    assert not Path(cert_path).exists() and not Path(cert_path).parent.exists()  # removed with the attempt
    assert not Path(cert_path).is_relative_to(ws)
    [step] = run.steps
    assert step.result == 'Got [TOKEN] and [ANTHROPIC_API_KEY].\n```json\n{"t": "[TOKEN]"}\n```'
    assert step.data == {"t": "[TOKEN]"}
    [tool] = [e for e in step.events if e.type == EventType.tool]
    capture = read_capture(svc, data_of(tool)["capture"])
    assert (tool.text, capture["input"], capture["output"]) == ("fetch [TOKEN]", "[TOKEN]", "[CERT]")
    said = [e.text for e in step.events if e.type == EventType.info]
    assert (
        "secret ANTHROPIC_API_KEY crosses as LANEFLOW_DECLARED_ANTHROPIC_API_KEY: a name starting ANTHROPIC_ belongs to "
        "the model's own settings, which a declared secret never replaces"
    ) in said
    assert "secrets from the --secrets file: TOKEN, CERT, LANEFLOW_DECLARED_ANTHROPIC_API_KEY" in said
    # The run has ended: its values are dropped (the store masks them no more).
    assert svc.redactor.held() == [] and svc.redactor(TOKEN) == TOKEN and svc.redactor.names() == []


def test_a_steps_secrets_come_from_the_workspaces_secrets_env_without_a_secrets_file(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    executor = seeing(svc)
    ws = fetcher_workspace(tmp_path, ["TOKEN"], f"Said {TOKEN}.")
    (ws / ".secrets.env").write_text(f"TOKEN={TOKEN}\n")
    run = drive(svc, ws, "fetch")
    assert run.status == RunStatus.completed, run.error
    assert executor.seen[0][1] == {"TOKEN": TOKEN} and run.steps[0].result == "Said [TOKEN]."
    assert any(e.text == "secrets from the workspace's .secrets.env: TOKEN" for e in run.steps[0].events)


def test_every_attempt_gets_its_own_file_and_a_failed_one_leaves_none_behind(on: ServicesOn, tmp_path: Path) -> None:
    svc = on(LANEFLOW_SECRETS_FILE=str(secrets_file(tmp_path, CERT=CERT)))
    executor = seeing(svc)
    ws = fetcher_workspace(tmp_path, ["@CERT"], ["fail: the API was busy", "Done."], retries=1)  # type: ignore[arg-type]
    run = drive(svc, ws, "fetch")
    assert run.status == RunStatus.completed and run.steps[0].attempts == 2, run.error
    first, second = (Path(env["CERT"]) for _, env, _ in executor.seen)
    assert first != second and not first.exists() and not second.exists()


# -- a missing secret -----------------------------------------------------------------------------


def test_a_missing_secret_fails_the_step_before_the_model_is_called_and_is_never_retried(on: ServicesOn, tmp_path: Path) -> None:
    svc = on(LANEFLOW_SECRETS_FILE=str(secrets_file(tmp_path, TOKEN=TOKEN)))
    executor = seeing(svc)
    ws = fetcher_workspace(tmp_path, ["TOKEN", "@MISSING"], f"Said {TOKEN}.", retries=2)

    run = drive(svc, ws, "fetch")

    [step] = run.steps
    assert run.status == RunStatus.failed and step.status == StepStatus.failed
    assert step.error == "secret MISSING is not set (declared by agent fetcher)"
    assert step.attempts == 1 and step.calls == [] and executor.seen == []  # no model call, no retry
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    assert (attempt.reason, attempt.reason_kind) == (step.error, FailureKind.other)
    assert svc.redactor.held() == []


def test_a_missing_secret_fails_a_claude_step_before_any_request_reaches_the_api(tmp_path: Path) -> None:
    key = "sk-test-0123456789abcdef"
    with MessagesImitation(ttft_ms=10, token_ms=0, api_keys={key}) as api:
        cfg = Settings(
            anthropic_api_key=SecretStr(key),
            anthropic_base_url=api.url,
            capture_dir=str(tmp_path / "captures"),
            secrets_file=str(secrets_file(tmp_path)),
        )
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), cfg)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=api.url, backoff_s=0.01)
        ws = write_workspace(
            tmp_path / "ws",
            {"fetcher": {"secrets": ["TOKEN"]}},
            {"fetch": {"steps": [{"agent": "fetcher", "instruction": "Fetch it."}]}},
            agents_md="model: claude-sonnet-4-6\n",
        )
        run = drive(svc, ws, "fetch")
        assert run.status == RunStatus.failed and run.steps[0].error == "secret TOKEN is not set (declared by agent fetcher)"
        assert run.steps[0].attempts == 1 and api.stats()["requests"] == 0


def test_a_bad_secret_name_is_refused_before_the_run_and_fails_a_step_whose_agent_changed_after(
    on: ServicesOn, tmp_path: Path
) -> None:
    """`laneflow check`'s refusal holds at the start of a run (nothing is written); an agent.md
    given a bad name after its run started fails that step, naming the file and the name,
    not retried."""
    svc = on()
    ws = fetcher_workspace(tmp_path, ["MY-TOKEN"], "Done.", retries=2)
    with pytest.raises(WorkspaceInvalid) as refused:
        drive(svc, ws, "fetch")
    assert "agents/fetcher/agent.md:2: secrets: 'MY-TOKEN' is not a secret name" in str(refused.value)
    assert svc.store.list_runs("local") == []

    ws = fetcher_workspace(tmp_path / "later", ["TOKEN"], "Done.", retries=2)
    run = create_run(svc, ws, "fetch")
    md = ws / "agents" / "fetcher" / "agent.md"
    md.write_text(md.read_text().replace("TOKEN", "MY-TOKEN"))
    step = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run.steps[0]
    assert step.status == StepStatus.failed and step.attempts == 1
    assert "'MY-TOKEN' is not a secret name" in (step.error or "") and "agents/fetcher/agent.md" in (step.error or "")


# -- the cloud source: Secrets Manager, by tenant ---------------------------------------------------


def test_secrets_come_from_secrets_manager_under_the_runs_tenant_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with services_on("dynamodb", tmp_path, monkeypatch, LANEFLOW_SECRET_SOURCE="secretsmanager") as svc:
        sm = boto3.client("secretsmanager", region_name="us-east-1")
        sm.create_secret(Name="laneflow/local/TOKEN", SecretString=TOKEN)
        sm.create_secret(Name="laneflow/acme/TOKEN", SecretString="acme-token-0123456789")
        sm.create_secret(Name="laneflow/local/CERT", SecretString=json.dumps({"CERT": CERT}))  # the console's key/value form
        source = SecretsManagerSecrets(region="us-east-1")
        assert source.read("acme", "", ["TOKEN", "CERT"]) == {"TOKEN": "acme-token-0123456789"}
        with pytest.raises(TenantInvalid):
            source.read("../acme", "", ["TOKEN"])  # a name no prefix can hold is never asked for

        executor = seeing(svc)
        ws = fetcher_workspace(tmp_path, ["TOKEN", "@CERT"], f"Said {TOKEN}.")
        run = drive(svc, ws, "fetch")

        assert run.status == RunStatus.completed, run.error
        [(_, env, files)] = executor.seen
        assert env["TOKEN"] == TOKEN and files == {"CERT": (0o600, CERT)}
        assert run.steps[0].result == "Said [TOKEN]."
        assert any(e.text == "secrets from Secrets Manager: TOKEN, CERT" for e in run.steps[0].events)

        sm.delete_secret(SecretId="laneflow/local/TOKEN", ForceDeleteWithoutRecovery=True)
        again = drive(svc, ws, "fetch")
        assert again.steps[0].error == "secret TOKEN is not set (declared by agent fetcher)"


def test_only_the_roles_that_run_steps_may_read_declared_secrets_and_only_under_laneflow() -> None:
    template = Template.load(ROOT / "template.yaml")
    readers = {}
    for logical_id, resource in template.resources.items():
        text = json.dumps(resource.get("Properties", {}))
        if "secret:laneflow/" in text:
            readers[logical_id] = text
    assert set(readers) == {"RunStepFunction", "SandboxTaskRole"}
    for text in readers.values():
        assert "secretsmanager:GetSecretValue" in text
        assert "secretsmanager:*" not in text and "secret:*" not in text
    run_step = template.resources["RunStepFunction"]["Properties"]["Environment"]["Variables"]
    assert run_step["LANEFLOW_SECRET_SOURCE"] == "secretsmanager"
    [container] = template.resources["SandboxTaskDefinition"]["Properties"]["ContainerDefinitions"]
    assert {"Name": "LANEFLOW_SECRET_SOURCE", "Value": "secretsmanager"} in container["Environment"]


# -- the command line ---------------------------------------------------------------------------------


@pytest.fixture
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LANEFLOW_SECRETS_FILE", "")  # none from the machine: only what the command is given
    settings.cache_clear()
    yield
    settings.cache_clear()


def test_laneflow_run_reads_the_secrets_file_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOKEN", raising=False)
    given = secrets_file(tmp_path, TOKEN=TOKEN)
    ws = fetcher_workspace(tmp_path, ["TOKEN"], f"Said {TOKEN}.")
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    code = main(["run", str(ws), "fetch", "--store", store, "--secrets", str(given), "--json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["steps"][0]["result"] == "Said [TOKEN]." and TOKEN not in out.out + out.err

    # A sandboxed step runs in a worker process: the file it was given reaches it too.
    md = ws / "agents" / "fetcher" / "agent.md"
    md.write_text(md.read_text().replace("---\n", "---\nsandbox: true\n", 1))
    code = main(["run", str(ws), "fetch", "--store", store, "--secrets", str(given), "--json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    [step] = json.loads(out.out)["steps"]
    assert any(e["text"].startswith("sandbox worker:") for e in step["events"]) and step["result"] == "Said [TOKEN]."
    assert TOKEN not in out.out + out.err

    code = main(["run", str(ws), "fetch", "--store", store, "--secrets", str(tmp_path / "nope.env")])
    assert code == 2 and f"--secrets {tmp_path / 'nope.env'}: no such file" in capsys.readouterr().err


def test_laneflow_run_without_the_secret_says_which_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOKEN", raising=False)
    ws = fetcher_workspace(tmp_path, ["TOKEN"], "Done.")
    code = main(["run", str(ws), "fetch", "--store", f"sqlite:///{tmp_path / 'cli.db'}", "--quiet"])
    assert code == 1 and "secret TOKEN is not set (declared by agent fetcher)" in capsys.readouterr().err


# -- captures -------------------------------------------------------------------------------------------


def test_metadata_captures_keep_no_tool_text_anywhere_events_included(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    said, answered = "INPUT-TEXT-never-kept", "OUTPUT-TEXT-never-kept"
    ws = write_workspace(
        tmp_path / "ws",
        {"fetcher": {"stub": f"call: lookup {said} => {answered}\n===\nDone."}},
        {"fetch": {"steps": [{"agent": "fetcher", "instruction": "Fetch it."}]}},
        agents_md="model: stub\ncapture: metadata\n",
    )
    run = drive(svc, ws, "fetch")
    assert run.status == RunStatus.completed, run.error
    [tool] = [e for e in run.steps[0].events if e.type == EventType.tool]
    assert tool.text == "lookup"
    assert set(tool.data) == {"tool", "input_chars", "output_chars", "ms"}  # type: ignore[arg-type]
    assert (data_of(tool)["input_chars"], data_of(tool)["output_chars"]) == (len(said), len(answered))
    stored = stored_bytes(on.kind, tmp_path)
    assert said.encode() not in stored and answered.encode() not in stored
    assert not (tmp_path / "captures").exists()


def _recorder(svc: Services, run_id: str, tenant: str, n_before: int = 0) -> StepRecorder:
    attempt = svc.store.claim_attempt(
        tenant, run_id, 0, token=os.urandom(8).hex(), started_at=utcnow(), expect_status=(StepStatus.pending, StepStatus.running)
    )
    prior = svc.store.get_step(tenant, run_id, 0, detail=True)
    return StepRecorder(
        svc=svc,
        ref=AttemptRef.of(tenant, attempt),
        base_n=0,
        redact=svc.redactor,
        _captured=captured(prior),
        _capture_full=capture_full(prior),
    )


def test_past_the_capture_limit_no_later_call_of_the_step_is_captured_and_the_trace_says_so_once(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on()
    ws = write_workspace(tmp_path / "ws", {"fetcher": {}}, {"fetch": {"steps": [{"agent": "fetcher"}]}})
    run = create_run(svc, ws, "fetch")
    big = "x" * (STEP_CAPTURE_LIMIT - 1_000_000)

    first = _recorder(svc, run.id, run.tenant)
    first.tool_call("read_file", "a", big)  # 3,000,001 characters: captured
    svc.store.end_attempt(first.ref, AttemptStatus.failed, reason="try again")
    second = _recorder(svc, run.id, run.tenant)  # the limit is the step's: this attempt starts at 3,000,001
    second.tool_call("read_file", "b", "y" * 999_999)  # to 4,000,001: over, not captured
    second.tool_call("list_files", "c", "tiny")  # small, but after the limit: not captured either
    second.tool_call("list_files", "d", "tiny")

    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    tools = [e for e in step.events if e.type == EventType.tool]
    assert ["capture" in data_of(e) for e in tools] == [True, False, False, False]
    assert [e.text for e in tools] == ["read_file a", "read_file", "list_files", "list_files"]
    warnings = [e for e in step.events if e.type == EventType.warning]
    assert len(warnings) == 1 and warnings[0].text.startswith("capture limit of 4,000,000 characters reached")
    svc.store.end_attempt(second.ref, AttemptStatus.failed, reason="try again")
    third = _recorder(svc, run.id, run.tenant)  # a later attempt knows the limit was reached
    third.tool_call("list_files", "e", "tiny")
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert sum(1 for e in step.events if e.type == EventType.warning) == 1
    assert "capture" not in data_of([e for e in step.events if e.type == EventType.tool][-1])
    captures = list((tmp_path / "captures").rglob("*.json"))
    assert len(captures) == 1


# -- real programs (bash), when the tools are here -------------------------------------------------
# A bash step is sandboxed: it runs in a sandbox worker (a child process) where one exists, so
# the secrets file must reach the worker, and under bubblewrap (a private /tmp) the folder of
# the `@NAME` files must be bound in (`domain.secrets.secret_file_folders`).


SHOW = (
    'tool: bash {"command": "echo T=$TOKEN; cat \\"$CERT\\"; echo; stat -c %a \\"$CERT\\"; '
    'echo N=$LANEFLOW_DECLARED_ANTHROPIC_API_KEY; echo K=${ANTHROPIC_API_KEY:-unset}"}\n===\nShown.'
)


@pytest.mark.parametrize("isolation", ["auto", "subprocess"])
def test_a_program_gets_each_secret_and_what_it_prints_of_them_is_recorded_masked(
    on: ServicesOn, tmp_path: Path, isolation: str
) -> None:
    given = secrets_file(tmp_path, TOKEN=TOKEN, CERT=CERT, ANTHROPIC_API_KEY=MODEL_NAMED)
    svc = on(LANEFLOW_SECRETS_FILE=str(given), LANEFLOW_ISOLATION=isolation)
    ws = write_workspace(
        tmp_path / "ws",
        {"fetcher": {"tools": ["bash"], "secrets": ["TOKEN", "@CERT", "ANTHROPIC_API_KEY"], "stub": SHOW}},
        {"fetch": {"steps": [{"agent": "fetcher", "instruction": "Show them.", "retries": 0}]}},
    )
    run = drive(svc, ws, "fetch")
    assert run.status == RunStatus.completed, run.error
    [tool] = [e for e in run.steps[0].events if e.type == EventType.tool]
    output = read_capture(svc, data_of(tool)["capture"])["output"]
    assert "T=[TOKEN]\n[CERT]\n600\nN=[ANTHROPIC_API_KEY]\nK=unset" in output, output
    stored = stored_bytes(on.kind, tmp_path)
    for value in (TOKEN, CERT, MODEL_NAMED):
        assert value.encode() not in stored


@pytest.mark.parametrize(
    "command", [["run", "WS", "FLOW"], ["demo"], ["resume", "RUN"], ["approve", "RUN"], ["reconcile"], ["serve"]]
)
def test_every_command_that_runs_steps_takes_a_secrets_file(command: Any) -> None:
    from laneflow.entrypoints.cli import build_parser

    assert build_parser().parse_args([*command, "--secrets", "prod.env"]).secrets == "prod.env"
