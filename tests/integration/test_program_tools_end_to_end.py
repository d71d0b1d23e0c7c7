"""bash and script tools end to end: the stub's `tool:` lines make real calls through the
real definition on the embedded engine, on both stores, recorded like a model's calls; the
Claude executor's tool loop runs the same tools against the Messages API imitation; the
agent's `effort` reaches the API the way each model takes it."""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from contract.store.backends import BACKENDS
from helpers import data_of, error_of
from test_claude_tools import KEY, Recording, directives

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.executors.isolation import detect
from laneflow.adapters.store import open_store
from laneflow.domain.flow import check_workspace
from laneflow.domain.records import AttemptStatus, Run, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SHOUT = textwrap.dedent("""\
    #!/bin/sh
    # Shouts its stdin, prefixed by its first argument,
    # and keeps it in storage/shouted.txt.
    read line
    echo "$1: $line" | tr a-z A-Z | tee storage/shouted.txt
    """)

STUB = textwrap.dedent("""\
    tool: script_shout {"args": ["{item}"], "stdin": "hello there"}
    tool: bash {"command": "echo to stderr >&2; exit 4"}
    tool: bash {"command": "echo $LANEFLOW_AGENT $LANEFLOW_STEP"}
    tool: script_shout not json
    ===
    Shouted for {item}.
    """)


def workspace(tmp_path: Path, *, agent_md: str, flow: str) -> Path:
    root = tmp_path / "ws"
    (root / "agents" / "shouter").mkdir(parents=True)
    (root / "agents" / "shouter" / "agent.md").write_text(agent_md)
    (root / "scripts").mkdir()
    (root / "scripts" / "shout").write_text(SHOUT)
    (root / "scripts" / "shout").chmod(0o755)
    (root / "flows").mkdir()
    (root / "flows" / "shout.yaml").write_text(flow)
    (root / "storage").mkdir()
    (root / "AGENTS.md").write_text("---\nmodel: stub\n---\nShared rules.\n")
    return root


def stub_agent(stub: str = STUB, extra: str = "") -> str:
    return f"---\ntools: [bash, scripts]\n{extra}stub: |\n{textwrap.indent(stub, '  ')}---\nYou shout.\n"


EACH = "input:\n  type: object\n  properties:\n    names: {type: array}\nsteps:\n  - agent: shouter\n    each: input.names\n    instruction: Shout for {item}.\n"


@pytest.fixture
def svc(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


def drive(svc: Services, ws: Path, flow: str, run_input: Any = None) -> Run:
    run = create_run(svc, ws, flow, run_input)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def captured(tmp_path: Path, event: Any) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((tmp_path / "captures" / event.data["capture"]).read_text())
    return answer


def test_stub_tool_lines_make_real_calls_recorded_like_a_models_on_both_stores(svc: Services, tmp_path: Path) -> None:
    ws = workspace(tmp_path, agent_md=stub_agent(), flow=EACH)
    run = drive(svc, ws, "shout", {"names": ["ada"]})
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.status == StepStatus.completed and step.conclusion == "Shouted for ada."
    isolation = [e.text for e in step.events if e.text.startswith("isolation: ")]
    [line] = isolation
    assert line.startswith(detect().describe() + "; ") and "; limits: " in line  # what fenced it, and what bound it
    calls = [e for e in step.events if e.type == "tool"]
    assert [data_of(e)["tool"] for e in calls] == ["script_shout", "bash", "bash", "script_shout"]
    assert [data_of(e).get("is_error", False) for e in calls] == [False, True, False, True]  # as a model's would be
    shout, failing, env, unparsed = (captured(tmp_path, e) for e in calls)
    assert json.loads(shout["input"]) == {"args": ["ada"], "stdin": "hello there"}  # {item} filled
    assert shout["output"] == "exit code: 0\n--- stdout ---\nADA: HELLO THERE\n\n--- stderr ---\n"
    assert failing["output"].startswith("exit code: 4") and "to stderr" in failing["output"]
    assert "--- stdout ---\nshouter 0\n" in env["output"]
    assert "is not JSON" in unparsed["output"]
    assert (ws / "storage" / "shouted.txt").read_text() == "ADA: HELLO THERE\n"  # the script's file persists
    assert step.calls[0].tools == 4  # the turn's span counts its calls


def test_a_stop_kills_a_sleeping_script_and_ends_the_attempt_stopped_on_both_stores(svc: Services, tmp_path: Path) -> None:
    stub = 'tool: bash {"command": "sleep 60"}\n===\nSlept.\n'
    ws = workspace(tmp_path, agent_md=stub_agent(stub), flow=EACH)
    run = create_run(svc, ws, "shout", {"names": ["ada"]})

    def stop_once_sleeping() -> None:
        # The isolation event is written just before the stub's only turn, which calls bash at
        # once (the attempt may work in a scratch copy, so the workspace shows nothing).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = svc.store.get_step(run.tenant, run.id, 0, detail=True).events
            if any(e.text.startswith("isolation: ") for e in events):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        stop_run(svc, run.tenant, run.id)

    watcher = threading.Thread(target=stop_once_sleeping)
    watcher.start()
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    watcher.join()
    [step] = final.steps
    assert final.status == RunStatus.failed and step.status == StepStatus.failed
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    # Killed, not waited for: a bash call that ran its 60 s would have ended on its own, and
    # the attempt would say so instead.
    assert attempt.status == AttemptStatus.stopped and attempt.reason is not None
    assert "its bash call was killed" in attempt.reason


def test_network_enforce_refuses_a_stub_step_whose_network_cannot_be_enforced_before_any_turn(tmp_path: Path) -> None:
    ws = workspace(tmp_path, agent_md=stub_agent(), flow=EACH)
    (ws / "AGENTS.md").write_text("---\nmodel: stub\nnetwork_enforce: true\n---\nShared rules.\n")
    # LANEFLOW_ISOLATION=subprocess: the plain subprocess, whose network cannot be fenced.
    settings = Settings.from_env({"LANEFLOW_ISOLATION": "subprocess", "LANEFLOW_CAPTURE_DIR": str(tmp_path / "captures")})
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'l.db'}"), settings)
    run = drive(svc, ws, "shout", {"names": ["ada"]})
    [step] = run.steps
    assert run.status == RunStatus.failed and step.status == StepStatus.failed and step.attempts == 1  # not retried
    assert "network_enforce is set" in error_of(step)
    assert step.calls == [] and not [e for e in step.events if e.type == "tool"]
    assert not (ws / "storage" / "shouted.txt").exists()


# -- the Claude executor ---------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(api_keys={KEY}) as server:
        yield server


def claude_drive(tmp_path: Path, api: MessagesImitation, ws: Path, model: str = "claude-sonnet-4-6") -> Run:
    settings = Settings(anthropic_api_key=KEY, anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01, isolation=detect())
    run = create_run(svc, ws, "shout", model=model)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def claude_flow(*calls: tuple[str, dict[str, Any]]) -> str:
    answer: str = "steps:\n  - agent: shouter\n    instruction: |\n" + directives(*calls, reply="Shouted.")
    return answer


def test_the_claude_tool_loop_runs_bash_and_script_tools_and_their_failures_come_back_as_is_error(
    tmp_path: Path, api: MessagesImitation
) -> None:
    recording = Recording()
    api.responder = recording
    calls: list[tuple[str, dict[str, Any]]] = [
        ("script_shout", {"args": ["bob"], "stdin": "hi"}),
        ("bash", {"command": "cat storage/shouted.txt; exit 3"}),
        ("bash", {"command": "sleep 5"}),
        ("script_shout", {"args": "not a list"}),
    ]
    ws = workspace(
        tmp_path, agent_md="---\ntools: [bash, script_shout, read_file]\ntimeout: 20\n---\nYou shout.\n", flow=claude_flow(*calls)
    )
    md = ws / "agents" / "shouter" / "agent.md"
    run = claude_drive(tmp_path, api, ws)
    assert run.status == RunStatus.completed, run.error
    tool_defs = recording.bodies[0]["tools"]
    assert [t["name"] for t in tool_defs] == ["bash", "read_file", "script_shout"]  # stable order
    assert tool_defs[2]["description"].startswith("Shouts its stdin, prefixed by its first argument, and keeps it")
    results = recording.tool_results()
    assert [r["is_error"] for r in results] == [False, True, False, True]
    events = [e for e in run.steps[0].events if e.type == "tool"]
    assert [data_of(e).get("is_error", False) for e in events] == [False, True, False, True]  # recorded as sent
    assert "BOB: HI" in results[0]["content"] and results[1]["content"].startswith("exit code: 3")
    assert "BOB: HI" in results[1]["content"] and "args must be a list" in results[3]["content"]
    assert md.read_text().startswith("---\ntools: [bash")


def test_a_claude_call_past_the_agents_timeout_is_killed_and_the_step_ends_with_the_reason(
    tmp_path: Path, api: MessagesImitation
) -> None:
    recording = Recording()
    api.responder = recording
    ws = workspace(
        tmp_path,
        agent_md="---\ntools: [bash]\ntimeout: 1\n---\nYou shout.\n",
        flow=claude_flow(("bash", {"command": "sleep 30"})),
    )
    run = claude_drive(tmp_path, api, ws)
    # The step's own timeout is the call's limit too: the call is killed at 1 s, the step then
    # ends timed out (not retried), instead of waiting 30 s for the program.
    [step] = run.steps
    assert step.status == StepStatus.failed and "timed out after 1 s" in error_of(step)
    [call] = [e for e in step.events if e.type == "tool"]
    assert data_of(call)["tool"] == "bash" and data_of(call)["ms"] < 3000
    assert "timed out and was killed after" in captured(tmp_path, call)["output"]


# -- effort --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "effort", "config", "betas"),
    [
        ("claude-opus-4-5", "medium", {"effort": "medium"}, ["effort-2025-11-24"]),
        ("claude-opus-4-6", "max", {"effort": "max"}, []),
        ("claude-sonnet-4-6", "low", {"effort": "low"}, []),
        ("claude-haiku-4-5", "high", None, []),
        ("claude-sonnet-4-6", "max", None, []),
    ],
)
def test_effort_reaches_the_api_the_way_each_model_takes_it(
    tmp_path: Path, api: MessagesImitation, model: str, effort: str, config: Any, betas: Any
) -> None:
    ws = workspace(tmp_path, agent_md=f"---\neffort: {effort}\n---\nYou shout.\n", flow=claude_flow())
    run = claude_drive(tmp_path, api, ws, model=model)
    assert run.status == RunStatus.completed, run.error
    [request] = api.received
    assert request["body"].get("output_config") == config and request["betas"] == betas
    warnings = [e.text for e in run.steps[0].events if "is not sent" in e.text]
    assert len(warnings) == (0 if config else 1)


@pytest.mark.parametrize(
    ("model", "config", "betas", "says"),
    [
        ("claude-opus-4-5", {"effort": "high"}, [], "beta header"),
        ("claude-haiku-4-5", {"effort": "high"}, [], "not supported by model"),
        ("claude-opus-4-5", {"effort": "max"}, ["effort-2025-11-24"], "supported values"),
        ("claude-opus-4-6", {"effort": "high", "other": 1}, [], "Extra inputs"),
    ],
)
def test_the_imitation_refuses_effort_the_way_the_api_does(
    api: MessagesImitation, model: str, config: Any, betas: Any, says: str
) -> None:
    client = anthropic.Anthropic(api_key=KEY, base_url=api.url, max_retries=0)
    create = client.beta.messages.create if betas else client.messages.create
    extra = {"betas": betas} if betas else {}
    with pytest.raises(anthropic.BadRequestError, match=says):
        create(model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}], output_config=config, **extra)


# -- laneflow check ----------------------------------------------------------------------------


def test_check_refuses_unknown_tools_with_the_closest_name_and_settings_nothing_would_do(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "scripts").mkdir()
    (root / "scripts" / "count.sh").write_text("#!/bin/sh\n")
    (root / "scripts" / "count.sh").chmod(0o755)
    md = root / "agents" / "writer" / "agent.md"
    md.write_text("---\ntools:\n  - read_file\n  - bassh\n  - script_cont\nsize: huge\napis: [weather]\n---\nYou write.\n")
    problems = {(p.field, p.line): p.message for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert "did you mean 'bash'" in problems[("tools[1]", 4)]
    assert "did you mean 'script_count'" in problems[("tools[2]", 5)]
    assert "one of 'small', 'medium', 'large'" in problems[("size", 6)]
    assert "an API is a mapping" in problems[("apis[0]", 7)]


def test_check_names_the_file_line_and_field_of_every_api_entry_problem(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    folder = root / "agents" / "writer"
    (folder / "broken.json").write_text('{"paths": {')
    (folder / "list.yaml").write_text("- just a list\n")
    md = folder / "agent.md"
    md.write_text(
        "---\n"
        'secrets: [TRACKER_TOKEN, "@CERT"]\n'
        "apis:\n"
        "  - {name: tracker, base_url: 'https://tracker.example.com/v1', headers: {X-Token: '${TRACKER_TOKN}'}}\n"
        "  - {name: 'bad name', base_url: 'ftp://files.example.com'}\n"
        "  - {name: files, base_url: 'https://user:pw@example.com', openapi: missing.yaml}\n"
        "  - {name: broken, base_url: 'https://example.com', openapi: broken.json, header: {}}\n"
        "  - {name: listed, base_url: 'http:///nohost', openapi: list.yaml, headers: {Cert: '${CERT}'}}\n"
        "  - {name: tracker, base_url: 'https://example.com?x=1', openapi: ../outside.yaml}\n"
        "---\nYou write.\n"
    )
    found = [(p.field, p.line, p.message) for p in check_workspace(root) if p.file == "agents/writer/agent.md"]
    problems = {(field, line): message for field, line, message in found}
    assert (
        "names secret TRACKER_TOKN, which is not in this agent's secrets: (did you mean 'TRACKER_TOKEN'?)"
        in problems[("apis[0].headers.X-Token", 4)]
    )
    assert "name is letters, digits" in problems[("apis[1].name", 5)]
    assert "must start with http:// or https://, got ftp" in problems[("apis[1].base_url", 5)]
    assert "cannot carry a user or password" in problems[("apis[2].base_url", 6)]
    assert problems[("apis[2].openapi", 6)] == "openapi file agents/writer/missing.yaml not found"
    assert "openapi file agents/writer/broken.json is not valid JSON (line 1" in problems[("apis[3].openapi", 7)]
    assert "unknown key 'header' (did you mean 'headers'?)" in problems[("apis[3].header", 7)]
    assert problems[("apis[4].base_url", 8)] == "base_url has no host"
    assert "is not an OpenAPI document" in problems[("apis[4].openapi", 8)]
    assert "declared as a file (@CERT)" in problems[("apis[4].headers.Cert", 8)]
    assert "listed twice" in problems[("apis[5].name", 9)]
    assert "cannot carry a query" in problems[("apis[5].base_url", 9)]
    assert "must be a path inside the agent's folder" in problems[("apis[5].openapi", 9)]
    assert len(found) == 13, found
    md.write_text(
        "---\nsecrets: [TRACKER_TOKEN]\napis:\n  - name: tracker\n    base_url: https://tracker.example.com/v1\n"
        "    headers: {Authorization: 'Bearer ${TRACKER_TOKEN}'}\n---\nYou write.\n"
    )
    assert [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"] == []
    # Written as blocks, each problem is on its own key's line.
    md.write_text(
        "---\nsecrets: [TRACKER_TOKEN]\napis:\n  - name: tracker\n    base_url: ftp://tracker.example.com\n"
        "    headers:\n      Accept: json\n      Authorization: 'Bearer ${TRACKER}'\n---\nYou write.\n"
    )
    lines = {p.field: p.line for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert lines == {"apis[0].base_url": 5, "apis[0].headers.Authorization": 8}


def test_check_refuses_secret_names_that_cannot_be_declared_and_a_size_nothing_would_use(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    md = root / "agents" / "writer" / "agent.md"
    md.write_text('---\nsecrets: [GOOD, "9LIVES", GOOD]\nsize: small\n---\nYou write.\n')
    problems = {(p.field, p.line): p for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert "'9LIVES' is not a secret name" in problems[("secrets", 2)].message
    assert problems[("size", 3)].severity == "error" and "runs none" in problems[("size", 3)].message
    md.write_text('---\ntools: [bash]\nsecrets: [GOOD, "@KEYFILE"]\nsize: small\n---\nYou write.\n')
    assert [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"] == []


def test_check_warns_when_the_agents_model_does_not_take_its_effort(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    md = root / "agents" / "writer" / "agent.md"
    md.write_text("---\nmodel: claude-haiku-4-5\neffort: high\n---\nYou write.\n")
    [warning] = [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"]
    assert warning.severity == "warning" and warning.line == 3 and "takes no effort setting" in warning.message
    md.write_text("---\nmodel: claude-opus-4-6\neffort: max\n---\nYou write.\n")
    assert [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"] == []


# -- the example ---------------------------------------------------------------------------------


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tides"


def test_the_tides_example_runs_its_script_with_its_secret_in_the_sandbox(tmp_path: Path) -> None:
    ws = tmp_path / "tides"
    shutil.copytree(EXAMPLE, ws)
    assert check_workspace(ws) == []
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'l.db'}"), Settings(capture_dir=str(tmp_path / "captures")))
    run = drive(svc, ws, "tides", {"places": ["Brest", "St Malo"]})
    assert run.status == RunStatus.completed, run.error
    for step in run.steps:
        [call] = [e for e in step.events if e.type == "tool"]
        output = captured(tmp_path, call)["output"]
        assert output.startswith("exit code: 0"), output
        assert "demo-tides-token" not in output
    assert (ws / "storage" / "tides-brest.md").read_text().startswith("# Tides at Brest")
    assert (ws / "storage" / "tides-st-malo.md").exists() and (ws / "state" / "tables-filed").read_text() == "2\n"


def test_check_says_an_api_tool_comes_from_its_apis_entry_not_tools(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "agents" / "writer" / "agent.md").write_text("---\ntools: [read_file, api_tracker]\n---\nYou write.\n")
    [problem] = [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"]
    assert (problem.line, problem.field) == (2, "tools[1]") and "comes from its apis: entry alone" in problem.message
