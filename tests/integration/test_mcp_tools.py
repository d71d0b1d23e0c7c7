"""MCP servers' tools end to end (`mcp:`): the stub's `tool:` lines make real calls to small
servers written with the SDK (tests/fixtures/mcp_servers/), on the embedded engine, recorded
like any tool's; over stdio and streamable HTTP (loopback only); a sandboxed step's stdio
server inside its sandbox, a plain step's outside; a dead and a slow server answer errors
and the run completes; a secret header never reaches the stored bytes; the Claude
executor's tool loop calls an MCP tool against the Messages API imitation."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from helpers import ServicesOn, drive, read_capture, stored_bytes, wait_for, write_workspace
from pydantic import SecretStr
from test_claude_tools import KEY, Recording, directives

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.executors.isolation import bubblewrap_available
from laneflow.adapters.executors.mcp_tools import MAX_RESULT_CHARS, McpTools, plain
from laneflow.adapters.executors.sandbox_user import NOBODY, SANDBOX_UID_BASE
from laneflow.adapters.store import open_store
from laneflow.domain.errors import StepStopped
from laneflow.domain.mcp import McpServer
from laneflow.domain.records import EventType, Run, RunStatus, Step
from laneflow.ports import ExecutionSink, Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SERVERS = FIXTURES / "mcp_servers"

ECHO: dict[str, Any] = {"name": "echo", "command": sys.executable, "args": [str(SERVERS / "echo_stdio.py")]}

SECRET = "mcp-secret-5e0b7d21a9"


def calls(step: Step) -> list[dict[str, Any]]:
    """Every tool event of the step with its capture, in order."""
    return [
        {"tool": e.data["tool"], "is_error": bool(e.data.get("is_error")), "capture": e.data.get("capture")}
        for e in step.events
        if e.type == EventType.tool and e.data
    ]


def outputs(svc: Services, step: Step) -> list[tuple[str, bool, str]]:
    """(tool, is_error, output) of each of the step's tool calls, in order."""
    return [(c["tool"], c["is_error"], read_capture(svc, c["capture"])["output"]) for c in calls(step)]


def stub(*lines: str, reply: str = "Done.") -> str:
    return "".join(f"tool: {line}\n" for line in lines) + reply


def one_agent(root: Path, agent: dict[str, Any], agents_md: str = "model: stub\n") -> Path:
    return write_workspace(
        root / "ws", {"caller": agent}, {"call": {"description": "one caller", "steps": [{"agent": "caller"}]}}, agents_md
    )


# -- stdio -----------------------------------------------------------------------------------


def test_a_stub_step_calls_a_stdio_servers_tools_recorded_and_masked(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    lines = (
        'mcp__echo__echo {"text": "hi"}',
        "mcp__echo__whoami {}",
        'mcp__echo__fail {"why": "it is a test"}',
        f'mcp__echo__big {{"chars": {MAX_RESULT_CHARS + 5}}}',
        "mcp__echo__nothing {}",
    )
    server = {**ECHO, "env": {"ECHO_GREETING": "${ECHO_KEY}"}}
    ws = one_agent(tmp_path, {"secrets": ["ECHO_KEY"], "mcp": [server], "stub": stub(*lines)})
    (ws / ".secrets.env").write_text(f"ECHO_KEY={SECRET}\n")
    run = drive(svc, ws, "call")
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Done."
    echo, whoami, fail, big, nothing = outputs(svc, step)
    assert echo == ("mcp__echo__echo", False, "hi")
    # Only its listed env and PATH, HOME, LANG, TZ; the secret filled in, and masked as recorded.
    assert whoami[2].splitlines()[:2] == ["env: ECHO_GREETING,HOME,LANG,PATH,TZ", "greeting: [ECHO_KEY]"]
    assert fail[1] and "failed because it is a test" in fail[2]
    assert not big[1] and big[2].endswith(f"[result cut at {MAX_RESULT_CHARS:,} of {MAX_RESULT_CHARS + 5:,} characters]")
    assert nothing[1] and "no such tool" in nothing[2] and "mcp__echo__echo" in nothing[2]
    [listed] = [e for e in step.events if e.type == EventType.info and e.text.startswith("MCP servers:")]
    assert listed.data == {"mcp": {"echo": 5}}
    layers = {layer.name: layer for layer in step.prompt_layers}
    assert "mcp" in layers and not layers["mcp"].dynamic
    assert SECRET.encode() not in stored_bytes(on.kind, tmp_path)


def test_a_workspace_server_serves_every_agent_and_an_agents_own_entry_replaces_it(svc: Services, tmp_path: Path) -> None:
    shared = yaml.safe_dump({"model": "stub", "mcp": [{**ECHO, "env": {"ECHO_GREETING": "from the workspace"}}]})
    agents: dict[str, dict[str, Any]] = {
        "plain": {"stub": stub("mcp__echo__whoami {}")},
        "own": {"mcp": [{**ECHO, "env": {"ECHO_GREETING": "its own"}}], "stub": stub("mcp__echo__whoami {}")},
    }
    flow = {"description": "two", "steps": [{"agent": "plain"}, {"agent": "own"}]}
    ws = write_workspace(tmp_path / "ws", agents, {"both": flow}, shared)
    run = drive(svc, ws, "both")
    assert run.status == RunStatus.completed, run.error
    greetings = [outputs(svc, step)[0][2].splitlines()[1] for step in run.steps]
    assert greetings == ["greeting: from the workspace", "greeting: its own"]


def test_a_dead_and_a_slow_server_answer_errors_and_the_run_completes(svc: Services, tmp_path: Path) -> None:
    dead = {**ECHO, "name": "dead", "args": [*ECHO["args"], "--exit-at-start"]}
    lines = ('mcp__dead__echo {"text": "hi"}', 'mcp__echo__slow {"seconds": 60}', 'mcp__echo__echo {"text": "after"}')
    # 12 s: time for the servers to start on a busy machine; the slow call waits out what is left.
    ws = one_agent(tmp_path, {"timeout": 12, "mcp": [dead, ECHO], "stub": stub(*lines)})
    run = drive(svc, ws, "call")
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    gone, slow, after = outputs(svc, step)
    assert gone[1] and "the MCP server dead could not start or list its tools" in gone[2]
    assert "echo: refusing to start" in gone[2]  # what it wrote on stderr
    assert slow[1] and "the MCP server echo gave no answer within" in slow[2]
    assert after[1] and "timeout is spent" in after[2]  # the slow call took what was left of the step's timeout
    warned = [e.text for e in step.events if e.type == EventType.warning]
    assert any(t.startswith("MCP server dead could not start") for t in warned), warned


def test_a_server_that_never_lists_its_tools_in_time_answers_an_error(svc: Services, tmp_path: Path) -> None:
    sleepy = {**ECHO, "name": "sleepy", "args": [*ECHO["args"], "--slow-start", "60"]}
    ws = one_agent(tmp_path, {"timeout": 2, "mcp": [sleepy], "stub": stub('mcp__sleepy__echo {"text": "hi"}')})
    run = drive(svc, ws, "call")
    assert run.status == RunStatus.completed, run.error
    [(tool, failed, output)] = outputs(svc, run.steps[0])
    assert tool == "mcp__sleepy__echo" and failed
    assert "did not start and list its tools within" in output


class Stoppable:
    """What McpTools reports to: its events kept, a stop set by the test."""

    inbox = None

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.events: list[str] = []

    def event(self, type: Any, text: str, data: dict[str, Any] | None = None) -> None:
        self.events.append(text)

    def stopped(self) -> bool:
        return self.stop.is_set()


def test_a_stop_ends_a_waiting_call_and_close_ends_the_server(tmp_path: Path) -> None:
    sink = Stoppable()
    tools = McpTools(
        (McpServer(**ECHO),),
        {},
        cast(ExecutionSink, sink),
        launcher=lambda argv, env: plain(argv, env, folder=tmp_path, lang="C.UTF-8", tz="UTC"),
        deadline=None,
    )
    try:
        pid = int(tools.run("mcp__echo__whoami", {}).rsplit("pid: ", 1)[1])
        os.kill(pid, 0)  # it runs
        threading.Timer(0.3, sink.stop.set).start()
        with pytest.raises(StepStopped, match="during its mcp__echo__slow call"):
            tools.run("mcp__echo__slow", {"seconds": 120})  # no stop heard: a ToolError after 60 s
    finally:
        tools.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert sink.events == ["MCP servers: echo (the program " + sys.executable + "): 5 tools"]


# -- the sandbox -----------------------------------------------------------------------------


def test_a_sandboxed_steps_stdio_server_runs_inside_its_sandbox_a_plain_steps_outside(svc: Services, tmp_path: Path) -> None:
    if not bubblewrap_available():
        pytest.skip("bubblewrap cannot run here: a sandbox is a plain subprocess")
    outside = tmp_path / "outside"
    outside.mkdir()
    raw = {"name": "raw", "command": "/usr/bin/python3", "args": ["tools/raw_stdio.py", str(outside)]}
    agents: dict[str, dict[str, Any]] = {
        "fenced": {"sandbox": True, "mcp": [raw], "stub": stub("mcp__raw__where {}")},
        "plain": {"mcp": [raw], "stub": stub("mcp__raw__where {}")},
    }
    flow = {"description": "two", "steps": [{"agent": "fenced"}, {"agent": "plain"}]}
    ws = write_workspace(tmp_path / "ws", agents, {"both": flow})
    (ws / "tools").mkdir()
    shutil.copy(SERVERS / "raw_stdio.py", ws / "tools" / "raw_stdio.py")
    run = drive(svc, ws, "both")
    assert run.status == RunStatus.completed, run.error
    [(_, fenced_error, fenced)] = outputs(svc, run.steps[0])
    [(_, plain_error, plain)] = outputs(svc, run.steps[1])
    assert not fenced_error and not plain_error
    # Inside: nobody in its own user namespace, the host's folder unseen, the step's program env.
    assert fenced.startswith("uid=65534 sees_host_path=False "), fenced
    assert "LANEFLOW_RUN_ID" in fenced
    assert plain == f"uid={os.getuid()} sees_host_path=True env=HOME,LANG,PATH,TZ"


def test_under_the_fallback_isolation_a_sandboxed_steps_server_gets_the_fence_it_has(tmp_path: Path) -> None:
    """Where bubblewrap cannot run (forced here: LANEFLOW_ISOLATION=subprocess), a sandboxed
    step's stdio server is started as its programs are under that isolation: the step's
    program environment and nothing of laneflow's own, and, when laneflow is root, as the
    unprivileged uid of its own its programs get (laneflow.adapters.executors.sandbox_user)."""
    settings = Settings.from_env({"LANEFLOW_ISOLATION": "subprocess", "LANEFLOW_CAPTURE_DIR": str(tmp_path / "captures")})
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'runs.db'}"), settings)
    raw = {"name": "raw", "command": "/usr/bin/python3", "args": ["tools/raw_stdio.py", "/"]}
    agents: dict[str, dict[str, Any]] = {"fenced": {"sandbox": True, "mcp": [raw], "stub": stub("mcp__raw__where {}")}}
    ws = write_workspace(tmp_path / "ws", agents, {"one": {"description": "one", "steps": [{"agent": "fenced"}]}})
    (ws / "tools").mkdir()
    shutil.copy(SERVERS / "raw_stdio.py", ws / "tools" / "raw_stdio.py")
    run = drive(svc, ws, "one")
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert any(e.text.startswith("isolation: subprocess") for e in step.events), [e.text for e in step.events]
    [(_, failed, said)] = outputs(svc, step)
    assert not failed
    uid = int(said.split()[0].removeprefix("uid="))
    if os.geteuid() == 0:  # the sandbox worker's own uid, never root's
        assert uid == NOBODY or uid > SANDBOX_UID_BASE, said
    else:
        assert uid == os.geteuid(), said
    env = said.split("env=", 1)[1].split(",")
    assert "LANEFLOW_RUN_ID" in env and "PATH" in env
    assert not {"LANEFLOW_ISOLATION", "LANEFLOW_CAPTURE_DIR", "PYTEST_CURRENT_TEST", "USER", "SHELL"} & set(env), env


# -- streamable HTTP -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def http_server() -> Iterator[str]:
    """The HTTP echo server on a free loopback port, requiring the token SECRET: its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVERS / "echo_http.py"), str(port), SECRET])
    try:
        wait_for(lambda: answers(port) or proc.poll() is not None, "the HTTP MCP server listening")
        assert proc.poll() is None, "the HTTP MCP server did not start"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


def test_an_http_servers_tools_with_a_secret_header_never_stored(on: ServicesOn, tmp_path: Path, http_server: str) -> None:
    svc = on()
    web = {"name": "web", "url": http_server, "headers": {"Authorization": "Bearer ${MCP_TOKEN}"}}
    lines = ('mcp__web__echo {"text": "hi"}', "mcp__web__authorization {}")
    ws = one_agent(tmp_path, {"secrets": ["MCP_TOKEN"], "mcp": [web], "stub": stub(*lines)})
    (ws / ".secrets.env").write_text(f"MCP_TOKEN={SECRET}\n")
    run = drive(svc, ws, "call")
    assert run.status == RunStatus.completed, run.error
    echo, header = outputs(svc, run.steps[0])
    assert echo == ("mcp__web__echo", False, "hi")  # the server refuses a request without the token
    assert header == ("mcp__web__authorization", False, "Bearer [MCP_TOKEN]")  # echoed back, masked
    assert SECRET.encode() not in stored_bytes(on.kind, tmp_path)


def test_an_http_server_refusing_the_request_answers_an_error(svc: Services, tmp_path: Path, http_server: str) -> None:
    web = {"name": "web", "url": http_server, "headers": {"Authorization": "Bearer wrong"}}
    ws = one_agent(tmp_path, {"timeout": 20, "mcp": [web], "stub": stub('mcp__web__echo {"text": "hi"}')})
    run = drive(svc, ws, "call")
    assert run.status == RunStatus.completed, run.error
    [(_, failed, output)] = outputs(svc, run.steps[0])
    assert failed and "the MCP server web could not start or list its tools" in output


# -- the Claude path -------------------------------------------------------------------------


def test_the_claude_tool_loop_calls_an_mcp_tool_and_its_result_reaches_the_next_turn(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    (ws / "agents" / "caller").mkdir()
    front = yaml.safe_dump({"max_turns": 4, "mcp": [ECHO]})
    (ws / "agents" / "caller" / "agent.md").write_text(f"---\n{front}---\nYou call.\n")
    instruction = directives(("mcp__echo__echo", {"text": "hi"}), reply="Called.")
    (ws / "flows" / "call.yaml").write_text(f"steps:\n  - agent: caller\n    instruction: |\n{instruction}")
    recording = Recording()
    with MessagesImitation(api_keys={KEY}) as api:
        api.responder = recording
        settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
        run: Run = create_run(svc, ws, "call", model="claude-sonnet-4-6")
        run = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Called."
    tools = {t["name"]: t for t in recording.bodies[0]["tools"]}
    assert tools["mcp__echo__echo"]["description"] == "Answers the text it is given."
    assert tools["mcp__echo__echo"]["input_schema"]["required"] == ["text"]
    names = [t["name"] for t in recording.bodies[0]["tools"]]
    assert names == sorted(names)
    assert all([t["name"] for t in body["tools"]] == names for body in recording.bodies)  # the same at every turn
    [result] = recording.tool_results()
    assert result["is_error"] is False and result["content"] == "hi"
    assert [c["tool"] for c in calls(step)] == ["mcp__echo__echo"]
    assert "mcp__echo__*: the program" in json.dumps(recording.bodies[0]["system"])
