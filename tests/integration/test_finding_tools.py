"""The finding tools end to end (`tools: [search]`, `tools: [history]`): the stub's `tool:`
lines make real calls through the real definition on the embedded engine, recorded like a
model's calls; `history` on both stores reads this workspace's earlier runs of this tenant
only, newest first and masked; the Claude executor's tool loop reaches `search` against the
Messages API imitation; `laneflow check` accepts both names."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from helpers import FlowRunner, ServicesOn, drive, read_capture, write_workspace
from pydantic import SecretStr
from test_claude_tools import KEY, Recording, directives

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.flow import check_workspace
from laneflow.domain.records import EventType, Run, RunStatus, Step
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SECRET = "scout-secret-7c41d09be3"


def tool_outputs(svc: Services, step: Step, tool: str) -> list[dict[str, Any]]:
    """The captures of the step's calls of `tool`, in order, each with its event's is_error."""
    found = []
    for event in step.events:
        if event.type == EventType.tool and event.data and event.data.get("tool") == tool:
            capture = read_capture(svc, event.data["capture"])
            found.append({**capture, "is_error": bool(event.data.get("is_error"))})
    return found


# -- search ----------------------------------------------------------------------------------


def search_workspace(root: Path, stub: str) -> Path:
    ws = write_workspace(
        root / "ws",
        {"finder": {"tools": ["search"], "stub": stub}},
        {"find": {"description": "one finder", "steps": [{"agent": "finder"}]}},
    )
    for rel, text in {
        "knowledge/ocean.md": "# Ocean\nThe TIDE turns at noon.\nNo match here.\n",
        "agents/finder/knowledge/own.md": "my own tide table\n",
        "storage/log.md": "first line\nhigh tide at six\n",
        "memory/m.md": "remember the tide\n",
        "agents/finder/memory/m.md": "the agent's own tide\n",
    }.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    (root / "outside.md").write_text("the tide outside the workspace\n")
    (ws / "storage" / "escape.md").symlink_to(root / "outside.md")
    return ws


def test_a_stub_step_searches_its_workspace_and_never_reads_outside_it(
    svc: Services, run_flow: FlowRunner, tmp_path: Path
) -> None:
    calls = [{"query": "tide", "in": "knowledge"}, {"query": "TIDE"}, {"query": "tide", "in": "moon"}]
    stub = "".join(f"tool: search {json.dumps(c)}\n" for c in calls) + "Found the tides."
    ws = search_workspace(tmp_path, stub)
    run = run_flow(ws, "find").run
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Found the tides."
    narrowed, everywhere, bad = tool_outputs(svc, step, "search")
    assert narrowed["output"].splitlines() == [
        "agents/finder/knowledge/own.md:1: my own tide table",
        "knowledge/ocean.md:2: The TIDE turns at noon.",
    ]
    assert not narrowed["is_error"] and not everywhere["is_error"]
    assert everywhere["output"].splitlines() == [
        "agents/finder/knowledge/own.md:1: my own tide table",
        "knowledge/ocean.md:2: The TIDE turns at noon.",
        "storage/log.md:2: high tide at six",
        "agents/finder/memory/m.md:1: the agent's own tide",
        "memory/m.md:1: remember the tide",
    ]
    assert "outside" not in everywhere["output"]  # the symlink out of the workspace is never read
    assert bad["is_error"] and "in must be one of" in bad["output"]
    layers = {layer.name: layer for layer in step.prompt_layers}
    assert "finding" in layers and not layers["finding"].dynamic


# -- history ---------------------------------------------------------------------------------


def history_workspace(root: Path) -> Path:
    """`scan`: a scout concluding a line with the tide and one with a declared secret;
    `recall`: a note of this run that also says "tide", then a reader calling history."""
    reader = [
        'tool: history {"query": "TIDE"}',
        'tool: history {"query": "tide", "in": "x"}',
        'tool: history {"query": "token", "flow": "scan", "limit": 1}',
        'tool: history {"query": "tide", "flow": "recall"}',
        "Read.",
    ]
    agents: dict[str, dict[str, Any]] = {
        "scout": {"secrets": ["SCOUT_KEY"], "stub": f"Scanned.\n===\nThe tide was {{input.n}} metres.\nToken {SECRET} seen."},
        "note": {"stub": "A tide note of this very run."},
        "reader": {"tools": ["history"], "stub": "\n".join(reader)},
    }
    flows = {
        "scan": {"description": "a scout", "steps": [{"agent": "scout"}]},
        "recall": {"description": "a reader", "steps": [{"agent": "note"}, {"agent": "reader"}]},
    }
    ws = write_workspace(root / "ws", agents, flows)
    (ws / ".secrets.env").write_text(f"SCOUT_KEY={SECRET}\n")
    return ws


def test_history_answers_this_workspaces_earlier_runs_of_this_tenant_newest_first_and_masked(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on()
    ws = history_workspace(tmp_path)
    first = drive(svc, ws, "scan", {"n": 1})
    second = drive(svc, ws, "scan", {"n": 2})
    elsewhere = drive(svc, ws, "scan", {"n": 3}, tenant="other")
    assert [r.status for r in (first, second, elsewhere)] == [RunStatus.completed] * 3, [first.error, second.error]
    stored = second.steps[0].conclusion or ""
    assert SECRET not in stored and "Token [SCOUT_KEY] seen." in stored  # masked as it was stored
    recall = drive(svc, ws, "recall")
    assert recall.status == RunStatus.completed, recall.error
    found, refused, token, none = tool_outputs(svc, recall.steps[1], "history")
    assert not found["is_error"] and not token["is_error"] and not none["is_error"]
    assert found["output"].splitlines() == [
        f"{second.id} {second.created_at} step 0 scout: The tide was 2 metres.",
        f"{first.id} {first.created_at} step 0 scout: The tide was 1 metres.",
    ]
    assert elsewhere.id not in found["output"] and recall.id not in found["output"]  # another tenant's; its own
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first.created_at)
    assert refused["is_error"] and "takes query, flow, limit; not in" in refused["output"]
    # Read back masked, the newest first, cut at its limit.
    assert SECRET not in token["output"]
    assert token["output"].splitlines() == [
        f"{second.id} {second.created_at} step 0 scout: Token [SCOUT_KEY] seen.",
        "[stopped at 1 matches: narrow the query]",
    ]
    assert none["output"].startswith("no earlier run of flow 'recall'")  # its own run is not its history


# -- the Claude path -------------------------------------------------------------------------


def test_the_claude_tool_loop_calls_search_and_its_result_reaches_the_next_turn(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    (ws / "agents" / "seeker").mkdir()
    (ws / "agents" / "seeker" / "agent.md").write_text("---\ntools: [search]\nmax_turns: 4\n---\nYou seek.\n")
    (ws / "storage" / "tides.md").write_text("Spring tides are the HIGHEST.\n")
    instruction = directives(("search", {"query": "highest", "in": "storage"}), reply="Sought.")
    (ws / "flows" / "seek.yaml").write_text(f"steps:\n  - agent: seeker\n    instruction: |\n{instruction}")
    recording = Recording()
    with MessagesImitation(api_keys={KEY}) as api:
        api.responder = recording
        settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
        run: Run = create_run(svc, ws, "seek", model="claude-sonnet-4-6")
        run = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Sought."
    assert "search" in [t["name"] for t in recording.bodies[0]["tools"]]
    [result] = recording.tool_results()
    assert result["is_error"] is False
    assert result["content"] == "storage/tides.md:1: Spring tides are the HIGHEST."
    assert [e.data["tool"] for e in step.events if e.type == EventType.tool and e.data] == ["search"]
    assert "# Finding things" in recording.bodies[0]["system"][0]["text"]


# -- laneflow check --------------------------------------------------------------------------


def test_check_accepts_search_and_history_and_suggests_for_a_misspelt_one(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    md = root / "agents" / "writer" / "agent.md"
    md.write_text("---\ntools: [search, history]\n---\nYou write.\n")
    assert [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"] == []
    md.write_text("---\ntools: [serch, history]\n---\nYou write.\n")
    problems = {p.field: p.message for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert "did you mean 'search'" in problems["tools[0]"]
