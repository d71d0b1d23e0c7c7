"""Bad input through the real entrances: the CLI, the API's resolver, and the embedded
engine running the real definition. Each is refused (exit 2, a 400) naming where, or,
found mid-run, fails its step with the file and line: never a crash, never a run left
`running`, nothing written for a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_calls import START, RecordingDrives, call
from helpers import FIXTURES, error_of, started_drives

from laneflow.adapters.engine.local import DriveResult
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.records import RunStatus, StepStatus
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run
from laneflow.wiring import local_engine


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def two_step_ws(tmp_path: Path, second_agent_md: str = "---\nmodel: stub\n---\nYou check.") -> Path:
    """`flows/f.yaml`: a writer, then a checker (agents/checker/agent.md as given)."""
    return write(
        tmp_path / "ws",
        {
            "AGENTS.md": "",
            "agents/writer/agent.md": "---\nmodel: stub\nstub: Drafted.\n---\nYou write.",
            "agents/checker/agent.md": second_agent_md,
            "flows/f.yaml": "steps:\n  - agent: writer\n  - agent: checker\n    retries: 0\n",
        },
    )


# -- the CLI -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, field", [('{"a": NaN}', "$.a"), ('{"a": ["x", Infinity]}', "$.a[1]"), ('{"t": "\\ud800"}', "$.t")]
)
def test_nan_in_run_input_is_refused_with_exit_2_naming_the_field_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, field: str
) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    ws = two_step_ws(tmp_path)

    code = main(["run", str(ws), "f", "--input", given, "--store", store, "--quiet"])

    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[0].startswith(f"laneflow: --input: {field}: ")
    assert main(["runs", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    "given, field, key",
    [('{"a": 1, "a": 2}', "$.a", "a"), ('{"t": [{"x": 1, "y": 2, "x": 3}]}', "$.t[0].x", "x"), ('{"": 1, "": 1}', '$[""]', "")],
)
def test_a_repeated_key_in_run_input_is_refused_with_exit_2_naming_it_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, field: str, key: str
) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    ws = two_step_ws(tmp_path)
    (tmp_path / "in.json").write_text(given)

    for source, arg in (("--input", given), (f"--input file {tmp_path / 'in.json'}", f"@{tmp_path / 'in.json'}")):
        code = main(["run", str(ws), "f", "--input", arg, "--store", store, "--quiet"])

        err = capsys.readouterr().err
        assert (
            code == 2
            and err.splitlines()[0]
            == f"laneflow: {source}: {field}: the key {json.dumps(key)} is given twice in one object; give it once"
        )
        assert "Traceback" not in err
    assert main(["runs", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    "rel, text, line, field",
    [
        ("agents/checker/agent.md", "---\nmodel: stub\nreviewed: 2001-13-45\n---\nYou check.", 3, "reviewed"),
        ("agents/checker/agent.md", "---\nmodel: stub\ntools:\n  - read_file\n  - 2001-02-30\n---\nYou check.", 5, "tools[1]"),
        ("AGENTS.md", "---\ncapture: full\njudge:\n  model: stub\n  since: 0000-01-01\n---\n", 5, "judge.since"),
        ("flows/f.yaml", "steps:\n  - agent: writer\n  - agent: checker\n    retries: 2001-13-45\n", 4, "steps[1].retries"),
        ("flows/f.yaml", "budget: 1e999\nsteps:\n  - agent: writer\n", 1, "budget"),
        ("agents/checker/agent.md", "---\nmodel: stub\ntimeout: 5\ntimeout: 50\n---\nYou check.", 4, "timeout"),
    ],
    ids=["agent-date", "agent-list-date", "agents-md-date", "flow-date", "flow-overflow", "agent-repeated-key"],
)
def test_a_yaml_value_that_cannot_be_constructed_is_a_problem_with_file_line_and_field_for_check_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rel: str, text: str, line: int, field: str
) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    ws = two_step_ws(tmp_path)
    (ws / rel).write_text(text)

    checked = main(["check", str(ws)])
    out, err = capsys.readouterr()
    ran = main(["run", str(ws), "f", "--store", store, "--quiet"])
    run_err = capsys.readouterr().err

    assert checked == 2 and ran == 2
    assert any(shown.startswith(f"{rel}:{line}: {field}: ") for shown in out.splitlines()), out
    assert f"{rel}:{line}: {field}: " in run_err, run_err
    assert "Traceback" not in err + run_err
    assert main(["runs", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_check_lists_a_type_error_beside_the_stub_cost_and_secret_name_problems_of_the_same_agent_md(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = two_step_ws(
        tmp_path,
        ('---\nmodel: stub\nbudget: "3"\nsecrets: [GOOD_NAME, "bad name"]\nstub: |\n  cost: inf\n  Checked.\n---\nYou check.'),
    )

    code = main(["check", str(ws)])

    out = capsys.readouterr().out.splitlines()
    assert code == 2
    assert "agents/checker/agent.md:3: budget: expected a number, got a string ('3')" in out
    assert any(shown.startswith("agents/checker/agent.md:6: stub: header cost: 'inf' is not a price") for shown in out), out
    assert any(shown.startswith("agents/checker/agent.md:4: secrets: 'bad name' is not a secret name") for shown in out), out


def test_a_literal_unbounded_stub_cost_is_refused_before_the_run_naming_agent_md_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    ws = two_step_ws(tmp_path, "---\nmodel: stub\nstub: |\n  cost: inf\n  Checked.\n---\nYou check.")

    code = main(["run", str(ws), "f", "--store", store, "--quiet"])

    err = capsys.readouterr().err
    assert code == 2 and "agents/checker/agent.md:4: stub: header cost: 'inf' is not a price" in err
    assert "Traceback" not in err


# -- the engine ------------------------------------------------------------------------------------


def drive(svc: Services, ws: Path, run_input: Any = None) -> DriveResult:
    run = create_run(svc, ws, "f", run_input)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)


@pytest.mark.parametrize("cost", ["inf", "nan"])
def test_a_stub_cost_filled_in_as_inf_or_nan_fails_the_step_naming_agent_md_and_the_field(
    svc: Services, tmp_path: Path, cost: str
) -> None:
    # Given an answer whose cost comes from the run's input (so only run time can tell)
    ws = two_step_ws(tmp_path, "---\nmodel: stub\nstub: 'cost: {input.cost}'\n---\nYou check.")

    result = drive(svc, ws, {"cost": cost})

    # Then the run ends failed (never left running), the reason names where, with no trace
    run = svc.store.get_run(result.run.tenant, result.run.id)
    step = run.steps[1]
    assert run.status == RunStatus.failed and step.status == StepStatus.failed
    assert step.error == (
        f"the stub answer in agents/checker/agent.md (stub) is not valid: cost: {cost!r} is not a price; "
        "write a number of USD from 0 to 1,000,000, such as 0.25"
    )
    assert "Traceback" not in (run.error or "") and run.cost_usd == 0


def test_an_agent_made_unreadable_mid_run_fails_its_step_naming_the_file_and_line(svc: Services, tmp_path: Path) -> None:
    # Given a run that passed its checks
    ws = two_step_ws(tmp_path)
    run = create_run(svc, ws, "f")
    # When the checker's agent.md is broken before its step's attempt
    (ws / "agents/checker/agent.md").write_text("---\nmodel: stub\ntools: [unclosed\n---\nYou check.")

    local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)

    # Then its step fails saying which file and line, relative to the workspace
    done = svc.store.get_run(run.tenant, run.id)
    step = done.steps[1]
    assert done.status == RunStatus.failed and step.status == StepStatus.failed
    assert error_of(step).startswith("agent 'checker' cannot be read: agents/checker/agent.md:")
    line = int(error_of(step).split("agents/checker/agent.md:")[1].split(":")[0])
    assert line in (3, 4)
    assert str(tmp_path) not in error_of(step) and str(ws) not in json.dumps(done.public())


# -- the API ---------------------------------------------------------------------------------------


@pytest.fixture
def api_svc(svc: Services) -> Services:
    svc.workspaces = FolderWorkspaces(FIXTURES)
    svc.drives = RecordingDrives()
    return svc


@pytest.mark.parametrize(
    "raw, field",
    [
        ('{"workspace": "ws_control", "flow": "approval", "input": {"a": NaN}}', "input.a"),
        ('{"workspace": "ws_control", "flow": "approval", "input": {"a": [-Infinity]}}', "input.a.0"),
        ('{"workspace": "ws_control", "flow": "approval", "input": {"a": 1e999}}', "input.a"),
        ('{"workspace": "ws_control", "flow": "approval", "input": {"\\ud800": 1}}', "input"),
        ('{"workspace": "ws_contr\\udfff", "flow": "approval"}', "workspace"),
    ],
)
def test_nan_infinity_and_surrogates_in_a_start_body_are_a_400_naming_the_field_and_write_nothing(
    api_svc: Services, raw: str, field: str
) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", raw_body=raw)

    assert status == 400 and payload["problems"][0]["field"] == field and field in payload["message"]
    assert api_svc.store.list_runs("acme") == [] and started_drives(api_svc) == []


@pytest.mark.parametrize(
    "route, raw, field",
    [
        ("/runs", '{"workspace": "ws_control", "flow": "approval", "flow": "rescue"}', "flow"),
        ("/runs", '{"workspace": "ws_control", "flow": "approval", "input": {"a": 1, "b": {"c": 1, "c": 2}}}', "input.b.c"),
        ("/runs/run-x/approval", '{"approve": true, "approve": false}', "approve"),
        ("/runs/run-x/steps/0/answer", '{"text": "yes", "text": "no"}', "text"),
        ("/estimates", '{"workspace": "ws_control", "flow": "approval", "input": {"n": 1, "n": 1}}', "input.n"),
    ],
)
def test_a_repeated_key_in_a_body_is_a_400_naming_it_and_writes_nothing(
    api_svc: Services, route: str, raw: str, field: str
) -> None:
    status, payload, _ = call(api_svc, "POST", route, raw_body=raw)

    key = field.rsplit(".", 1)[-1]
    assert status == 400 and payload["problems"][0]["field"] == field and field in payload["message"], payload
    assert payload["problems"][0]["message"] == f'the key "{key}" is given twice in one object; give it once'
    assert api_svc.store.list_runs("acme") == [] and started_drives(api_svc) == []


@pytest.mark.parametrize("raw", ["[" * 100_000, '{"input":' * 3000 + "{}" + "}" * 3000, '{"a": "' + "x" * (1024 * 1024) + '"}'])
def test_a_body_nested_too_deep_or_too_large_is_a_400_never_a_500(api_svc: Services, raw: Any) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", raw_body=raw)

    assert status == 400 and payload["problems"][0]["in"] == "body"
    assert api_svc.store.list_runs("acme") == []


def test_nan_in_an_approval_body_is_a_400_naming_the_field(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs/run-x/approval", raw_body='{"approve": NaN}')

    assert status == 400 and payload["problems"][0]["field"] == "approve"


def test_a_base64_body_is_read_as_json_and_one_that_is_not_utf8_is_a_400(api_svc: Services) -> None:
    import base64

    from api_calls import rest_event

    from laneflow.entrypoints.api import resolve

    good = rest_event("POST", "/runs", raw_body=base64.b64encode(json.dumps(START).encode()).decode())
    good["isBase64Encoded"] = True
    assert resolve(good, None, api_svc)["statusCode"] == 201

    bad = rest_event("POST", "/runs", raw_body=base64.b64encode(b"\xff\xfe{").decode())
    bad["isBase64Encoded"] = True
    out = resolve(bad, None, api_svc)
    assert out["statusCode"] == 400 and len(api_svc.store.list_runs("acme")) == 1
