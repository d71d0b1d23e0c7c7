"""Delegation end to end (agent.md `delegates:`): a step's `delegate` call runs the named
agent's own loop inside the attempt, on the stub (its answers from the delegate's own
`stub:`) through the real definition on the embedded engine, on both stores; its reply is
the call's result, its turns are spans of the step marked with its name, its cost is the
step's and the run's; a cycle, the depth limit and an agent not granted are `is_error`
results; a stop during a delegate's turn ends the step; a delegate that runs programs puts
the step in a sandbox; `laneflow check` refuses a delegate that does not exist."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, drive, read_capture, stored_bytes, wait_for, write_workspace
from pydantic import SecretStr
from test_claude_tools import KEY, Recording, directives

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.flow import check_workspace
from laneflow.domain.lanes import SANDBOXED
from laneflow.domain.records import EventType, Run, RunStatus, Step, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SECRET = "clerk-secret-51d0e2a9c7"


def delegate(agent: str, task: str) -> str:
    return f"tool: delegate {json.dumps({'agent': agent, 'task': task})}"


def delegate_results(svc: Services, step: Step) -> list[dict[str, Any]]:
    """What the step's own `delegate` calls returned, in order, each with its is_error."""
    found = []
    for event in step.events:
        data = event.data or {}
        if event.type == EventType.tool and data.get("tool") == "delegate" and "delegate" not in data:
            found.append({**read_capture(svc, data["capture"]), "is_error": bool(data.get("is_error"))})
    return found


def chain_workspace(root: Path) -> Path:
    """`boss` delegates to `researcher` (twice, a list of answers) and, refused, to `writer`;
    `researcher` delegates to `clerk`, who has a secret and tries `boss` (above it) and
    `intern` (past the depth)."""
    agents: dict[str, dict[str, Any]] = {
        "boss": {
            "delegates": ["researcher"],
            "stub": "\n".join(
                [
                    delegate("researcher", "Find the tide for {item}."),
                    delegate("researcher", "And the moon."),
                    delegate("writer", "Write it."),
                    "===",
                    "Boss done with {item}.",
                ]
            ),
        },
        "researcher": {
            "description": "finds facts in the knowledge",
            "delegates": ["clerk"],
            "stub": [f"cost: 0.25\n{delegate('clerk', 'File it.')}\n===\nThe tide is high.", "cost: 0.5\nThe moon is full."],
        },
        "clerk": {
            "delegates": ["boss", "intern"],
            "secrets": ["CLERK_KEY"],
            "stub": f"{delegate('boss', 'Loop.')}\n{delegate('intern', 'Deeper.')}\n===\nFiled, token {SECRET}.",
        },
        "intern": {"stub": "Intern never runs."},
        "writer": {"stub": "Writer never runs."},
    }
    flows = {"chain": {"description": "a boss and its colleagues", "steps": [{"agent": "boss", "each": ["north"]}]}}
    ws = write_workspace(root / "ws", agents, flows)
    (ws / ".secrets.env").write_text(f"CLERK_KEY={SECRET}\n")
    return ws


def test_a_delegates_reply_is_the_calls_result_its_turns_are_the_steps_and_refusals_are_tool_errors(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on()
    run = drive(svc, chain_workspace(tmp_path), "chain")
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Boss done with north."
    first, second, refused = delegate_results(svc, step)
    assert first["output"] == "The tide is high." and not first["is_error"]
    assert second["output"] == "The moon is full." and not second["is_error"]  # the delegate's second answer
    assert refused["is_error"] and "boss may delegate only to" in refused["output"] and "'writer'" in refused["output"]
    # Every turn is a span of the step: the boss's two, the researcher's (2 + 1), the clerk's two.
    by = [call.delegate for call in step.calls]
    assert by.count(None) == 2 and by.count("researcher") == 3 and by.count("clerk") == 2
    assert [call.n for call in step.calls] == list(range(1, len(step.calls) + 1))
    # Its cost is the step's and the run's.
    assert step.cost_usd == pytest.approx(0.75)
    assert run.cost_usd == pytest.approx(0.75)
    # The clerk, two levels down, was refused calling back up and going deeper.
    clerk_calls = [
        {**read_capture(svc, e.data["capture"]), "is_error": bool(e.data.get("is_error"))}
        for e in step.events
        if e.type == EventType.tool and e.data and e.data.get("delegate") == "clerk" and e.data.get("tool") == "delegate"
    ]
    loop, deeper = clerk_calls
    assert loop["is_error"] and "boss is above clerk" in loop["output"]
    assert deeper["is_error"] and "at most 2 deep" in deeper["output"]
    # The clerk's reply reached the researcher, masked: its secret never stored anywhere.
    researcher = [e for e in step.events if e.type == EventType.tool and (e.data or {}).get("delegate") == "researcher"]
    assert [read_capture(svc, e.data["capture"])["output"] for e in researcher if e.data] == ["Filed, token [CLERK_KEY]."]
    assert SECRET.encode() not in stored_bytes(on.kind, tmp_path)
    lines = [e.text for e in step.events if e.type == EventType.info and (e.data or {}).get("depth")]
    assert lines[:2] == [
        "boss delegated to researcher (stub): Find the tide for north.",
        "researcher delegated to clerk (stub): File it.",
    ]
    layers = {layer.name: layer for layer in step.prompt_layers}
    assert "delegates" in layers and not layers["delegates"].dynamic


def test_a_delegates_spend_counts_against_the_steps_budget(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    agents: dict[str, dict[str, Any]] = {
        "boss": {"delegates": ["pricey"], "budget": 1.0, "stub": f"{delegate('pricey', 'Spend.')}\n===\nNever said."},
        "pricey": {"stub": "cost: 1.5\nSpent."},
    }
    ws = write_workspace(tmp_path / "ws", agents, {"spend": {"description": "x", "steps": [{"agent": "boss"}]}})
    run = drive(svc, ws, "spend")
    assert run.status == RunStatus.failed
    [step] = run.steps
    assert step.status == StepStatus.failed and "budget" in (step.error or "")
    assert step.cost_usd == pytest.approx(1.5)
    # The boss's first turn and the delegate's, and no turn of the boss after it.
    assert sorted(c.delegate or "" for c in step.calls) == ["", "pricey"]


def test_a_stop_during_a_delegates_turn_ends_the_step(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    agents: dict[str, dict[str, Any]] = {
        "boss": {"delegates": ["slow"], "stub": f"{delegate('slow', 'Take your time.')}\n===\nNever said."},
        "slow": {"stub": "delay_ms: 60000\nToo late."},
    }
    ws = write_workspace(tmp_path / "ws", agents, {"wait": {"description": "x", "steps": [{"agent": "boss"}]}})
    run = create_run(svc, ws, "wait")
    ended: list[Run] = []
    driver = threading.Thread(target=lambda: ended.append(local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run))
    driver.start()
    try:
        wait_for(
            lambda: any("delegated to slow" in e.text for e in svc.store.get_step(run.tenant, run.id, 0, detail=True).events),
            "the delegation",
        )
        stop_run(svc, run.tenant, run.id)
    finally:
        driver.join(60)
    assert not driver.is_alive()
    [done] = ended
    assert done.status == RunStatus.failed and done.stop_requested
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert step.status == StepStatus.failed and (step.error or "").startswith("stopped by a person"), step.error
    assert step.calls == []  # the boss's turn was cut with its delegate's: neither became a span


def test_a_step_whose_delegate_runs_programs_runs_in_a_sandbox(svc: Services, tmp_path: Path) -> None:
    agents: dict[str, dict[str, Any]] = {
        "boss": {"delegates": ["runner"], "stub": f"{delegate('runner', 'Run it.')}\n===\nRan."},
        "runner": {
            "tools": ["bash"],
            "stub": 'tool: bash {"command": "echo ran in $LANEFLOW_AGENT at step $LANEFLOW_STEP; ls agents"}\n===\nDone.',
        },
        "bystander": {"stub": "Not reached."},
    }
    ws = write_workspace(tmp_path / "ws", agents, {"prog": {"description": "x", "steps": [{"agent": "boss"}]}})
    (ws / "agents" / "bystander" / "private.md").write_text("not for the boss's copy\n")
    run = create_run(svc, ws, "prog")
    assert "boss" in run.options[SANDBOXED]  # though the boss runs no program itself
    assert run.options["delegates"] == {"boss": ["runner"]}
    done = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert done.status == RunStatus.completed, done.error
    [step] = done.steps
    assert any("sandbox worker" in e.text for e in step.events)
    bash = [e for e in step.events if e.type == EventType.tool and (e.data or {}).get("tool") == "bash"]
    [call] = bash
    assert call.data is not None and call.data["delegate"] == "runner"
    output = read_capture(svc, call.data["capture"])["output"]
    assert "ran in runner at step 0" in output  # the delegate's environment, in the step's sandbox
    # Its scratch copy holds the boss's folder and its delegate's, never another agent's.
    assert output.split("--- stdout ---\n")[1].split("\n--- stderr")[0].split() == [
        "ran",
        "in",
        "runner",
        "at",
        "step",
        "0",
        "boss",
        "runner",
    ]


def test_check_refuses_a_delegate_that_is_not_an_agent_and_an_agent_delegating_to_itself(tmp_path: Path) -> None:
    agents: dict[str, dict[str, Any]] = {
        "boss": {"delegates": ["researchr", "boss"]},
        "researcher": {"tools": ["delegate"]},
    }
    ws = write_workspace(tmp_path / "ws", agents, {"f": {"description": "x", "steps": [{"agent": "boss"}]}})
    found = [p for p in check_workspace(ws) if p.severity == "error"]
    problems = {(p.file, p.field): p.message for p in found}
    assert "did you mean 'researcher'?" in problems[("agents/boss/agent.md", "delegates[0]")]
    assert "cannot delegate to itself" in problems[("agents/boss/agent.md", "delegates[1]")]
    assert "comes from delegates: alone" in problems[("agents/researcher/agent.md", "tools[0]")]
    lines = {p.field: p.line for p in found}
    assert lines["delegates[0]"] is not None


def test_the_claude_tool_loop_delegates_and_the_delegate_runs_its_own_request(tmp_path: Path) -> None:
    """Against the Messages API imitation: the boss's `delegate` call becomes the delegate's
    own request (its own system prompt, model and tools); its final reply is the boss's
    tool result, and both requests' turns are spans of the one step."""
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    for name, front in {
        "boss": "delegates: [researcher]\nmax_turns: 4",
        "researcher": "model: claude-haiku-4-5\ndescription: finds the tides\ntools: [search]",
    }.items():
        (ws / "agents" / name).mkdir()
        (ws / "agents" / name / "agent.md").write_text(f"---\n{front}\n---\nYou are the {name}.\n")
    instruction = directives(("delegate", {"agent": "researcher", "task": "Find the spring tide."}), reply="Delegated.")
    (ws / "flows" / "ask.yaml").write_text(f"steps:\n  - agent: boss\n    instruction: |\n{instruction}")
    recording = Recording()
    with MessagesImitation(api_keys={KEY}) as api:
        api.responder = recording
        settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
        run = create_run(svc, ws, "ask")
        run = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Delegated."
    boss_first, delegate_request, boss_last = recording.bodies
    assert boss_first["model"] == "claude-sonnet-4-6" and delegate_request["model"] == "claude-haiku-4-5"
    assert "delegate" in [t["name"] for t in boss_first["tools"]]
    assert [t["name"] for t in delegate_request["tools"]] == ["search"]  # its own tools, not the boss's
    assert "You are the researcher." in delegate_request["system"][0]["text"]
    assert "- researcher: finds the tides" in boss_first["system"][0]["text"]  # the delegates layer
    assert delegate_request["messages"][0]["content"] == "Find the spring tide."  # the task, whole, and nothing else
    results = [
        b
        for m in boss_last["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    [result] = results
    assert result["is_error"] is False and result["content"] == "Reply to: Find the spring tide.\nTurn 1."
    assert [(c.delegate, c.model) for c in step.calls] == [
        (None, "claude-sonnet-4-6"),
        ("researcher", "claude-haiku-4-5"),
        (None, "claude-sonnet-4-6"),
    ]
    assert step.cost_usd == pytest.approx(sum(c.cost_usd for c in step.calls), abs=1e-5) and step.cost_usd > 0


def test_a_lanes_delegations_to_one_agent_write_its_prefix_once(on: ServicesOn, tmp_path: Path) -> None:
    """Three boss steps in one lane each delegate to the researcher: the siblings start once
    the lead boss's reply began, and delegate while the lead's delegate has not yet begun its
    reply. The first delegation leads its prefix's gate; the others wait for its reply to
    begin, then read the prefix it wrote: one cold prefix for the three."""
    svc = on()
    agents: dict[str, dict[str, Any]] = {
        "boss": {"delegates": ["researcher"], "stub": f"ttft_ms: 100\n{delegate('researcher', 'Look up {item}.')}\n===\nDone."},
        "researcher": {"stub": "ttft_ms: 600\nLooked up."},
    }
    flows = {"fan": {"description": "x", "steps": [{"agent": "boss", "each": ["a", "b", "c"], "parallel": 3}]}}
    run = drive(svc, write_workspace(tmp_path / "ws", agents, flows), "fan")
    assert run.status == RunStatus.completed, run.error
    spans = [call for step in run.steps for call in step.calls if call.delegate == "researcher"]
    assert len(spans) == 3
    assert sorted(call.tokens.cache_write > 0 for call in spans) == [False, False, True]
    assert all(call.tokens.cache_read > 0 for call in spans if not call.tokens.cache_write)
    # Those that came while the first had not begun said so, and were released (how many
    # came that early is the machine's timing; that none wrote the prefix again is not).
    for step in run.steps:
        gate_lines = [e.text for e in step.events if e.type == EventType.gate and "[researcher]" in e.text]
        if gate_lines:
            waiting, released = gate_lines
            assert "waiting for the first researcher delegation's reply" in waiting and "released after" in released
