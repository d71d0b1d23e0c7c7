"""Anthropic's server tools end to end (`tools: [web_search, web_fetch]`), on both stores:
the stub's web lines get pretend results recorded as a real use is (masked and captured,
priced from the catalog, `web_max_uses` honoured); the Claude executor sends the tools'
definitions with their `max_uses` against the Messages API imitation, which runs them, and
the step's record has each use with its pages, the citations and the searches' price."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, drive, read_capture, services_on, stored_bytes, write_workspace
from test_claude_tools import KEY, Recording, directives

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.domain.flow import check_workspace
from laneflow.domain.pricing import catalog
from laneflow.domain.records import EventType, RunStatus, Step
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run
from laneflow.wiring import local_engine
from laneflow_dev.imitation import MessagesImitation, Reply

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SECRET = "tide-secret-4f1a9c07d2"

MODEL = "claude-sonnet-4-6"


def tool_calls(svc: Services, step: Step) -> list[dict[str, Any]]:
    """The step's tool calls in order: name, captured input and output, is_error."""
    found = []
    for event in step.events:
        if event.type == EventType.tool and event.data:
            capture = read_capture(svc, event.data["capture"])
            found.append({"tool": event.data["tool"], **capture, "is_error": bool(event.data.get("is_error"))})
    return found


def web_events(step: Step) -> list[dict[str, Any]]:
    return [e.data for e in step.events if e.type == EventType.info and e.data and "web_search_requests" in e.data]


# -- the stub --------------------------------------------------------------------------------


def test_a_stub_steps_web_lines_are_recorded_as_uses_masked_priced_and_held_to_web_max_uses(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on()
    lines = [
        f'tool: web_search {{"query": "tides {SECRET}"}}',
        'tool: web_fetch {"url": "https://example.com/tides"}',
        'tool: web_search {"q": 1}',  # not what it takes
        'tool: web_search {"query": "third"}',  # past web_max_uses (2) in this turn
        "Searched.",
        "===",
        'tool: web_search {"query": "next turn"}',  # a new turn: a new request, counted afresh
        "Found the tides.",
    ]
    agent = {"tools": ["web_search", "web_fetch"], "web_max_uses": 2, "secrets": ["TIDE_KEY"], "stub": "\n".join(lines)}
    ws = write_workspace(tmp_path / "ws", {"scout": agent}, {"scan": {"description": "a scout", "steps": [{"agent": "scout"}]}})
    (ws / ".secrets.env").write_text(f"TIDE_KEY={SECRET}\n")

    run = drive(svc, ws, "scan")

    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Found the tides."
    calls = tool_calls(svc, step)
    assert [c["tool"] for c in calls] == ["web_search", "web_fetch", "web_search", "web_search", "web_search"]
    assert [c["is_error"] for c in calls] == [False, False, True, True, False]
    first, fetched, bad, over, later = (c["output"] for c in calls)
    assert json.loads(calls[0]["input"]) == {"query": "tides [TIDE_KEY]"}  # masked like any tool's input
    assert first.splitlines() == [
        "1. Pretend result 1 for tides [TIDE_KEY]",
        "   https://example.com/web-search/1?q=tides%20[TIDE_KEY]",
        "2. Pretend result 2 for tides [TIDE_KEY]",
        "   https://example.com/web-search/2?q=tides%20[TIDE_KEY]",
    ]
    assert fetched.splitlines() == ["1. Pretend page at https://example.com/tides", "   https://example.com/tides"]
    assert bad == "error: invalid_tool_input" and over == "error: max_uses_exceeded"
    assert "next turn" in later
    searches = [(e["web_search_requests"], e["web_fetch_requests"]) for e in web_events(step)]
    assert searches == [(1, 1), (1, 0)]  # what was made: the refused uses are not requests
    price = catalog().server_tools_cost(1)
    assert price == pytest.approx(0.01)
    assert step.cost_usd == pytest.approx(2 * price) and run.cost_usd == pytest.approx(2 * price)
    assert [c.cost_usd for c in step.calls] == pytest.approx([price, price])
    layers = {layer.name: layer for layer in step.prompt_layers}
    assert "web" in layers and not layers["web"].dynamic
    assert SECRET.encode() not in stored_bytes(on.kind, tmp_path)


def test_a_web_line_of_an_agent_without_the_web_tool_is_a_tool_error(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    agent = {"tools": ["web_fetch"], "stub": 'tool: web_search {"query": "x"}\nDone.'}
    ws = write_workspace(tmp_path / "ws", {"scout": agent}, {"scan": {"description": "a scout", "steps": [{"agent": "scout"}]}})
    run = drive(svc, ws, "scan")
    assert run.status == RunStatus.completed, run.error
    [call] = tool_calls(svc, run.steps[0])
    assert call["is_error"] and "no tool 'web_search'" in call["output"]
    assert web_events(run.steps[0]) == []


# -- the Claude path -------------------------------------------------------------------------


def claude_workspace(tmp_path: Path, agent_md: str, instruction: str) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    (ws / "agents" / "scout").mkdir()
    (ws / "agents" / "scout" / "agent.md").write_text(agent_md)
    (ws / "storage" / "tides.md").write_text("Spring tides are the highest.\n")
    (ws / "flows" / "scan.yaml").write_text(f"steps:\n  - agent: scout\n    instruction: |\n{instruction}")
    return ws


def drive_claude(svc: Services, api: MessagesImitation, ws: Path) -> Any:
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
    run = create_run(svc, ws, "scan", model=MODEL)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def test_the_claude_path_sends_the_web_tools_and_records_their_uses_pages_citations_and_price(
    on: ServicesOn, tmp_path: Path
) -> None:
    agent_md = "---\ntools: [web_search, web_fetch, read_file]\nweb_max_uses: 2\nmax_turns: 4\n---\nYou scout.\n"
    instruction = directives(
        ("web_search", {"query": "spring tides"}),
        ("web_fetch", {"url": "https://example.com/tides"}),
        ("web_search", {"query": "neap tides"}),
        ("web_search", {"query": "king tides"}),  # the third search of the request: past max_uses
        ("read_file", {"path": "storage/tides.md"}),  # a client tool: laneflow runs it
        ("web_search", {"query": "after reading"}),  # the next request: its uses counted afresh
        reply="Tides found.",
    )
    ws = claude_workspace(tmp_path, agent_md, instruction)
    recording = Recording()
    with MessagesImitation(api_keys={KEY}) as api:
        api.responder = recording
        svc = on(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=api.url)
        run = drive_claude(svc, api, ws)
        stats, betas = api.stats(), [r["betas"] for r in api.received]

    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "Tides found."
    # The request: the server tools among the tools, in the stable (name) order, with max_uses.
    tools = recording.bodies[0]["tools"]
    assert [t["name"] for t in tools] == ["read_file", "web_fetch", "web_search"]
    assert tools[1] == {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2, "citations": {"enabled": True}}
    assert tools[2] == {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    assert all(b == ["web-fetch-2025-09-10"] for b in betas) and len(betas) == 2
    # The server tools' blocks went back in the assistant message as they came, run by none but the API.
    sent_back = recording.bodies[1]["messages"][1]
    assert sent_back["role"] == "assistant"
    kinds = [b["type"] for b in sent_back["content"]]
    assert kinds[:8] == ["server_tool_use", "web_search_tool_result", "server_tool_use", "web_fetch_tool_result"] + [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_search_tool_result",
    ]
    assert kinds[8:] == ["text", "tool_use"]
    assert sent_back["content"][1]["content"][0]["encrypted_content"]  # kept for the API to read again
    assert sent_back["content"][8]["citations"][0]["type"] == "web_search_result_location"
    [result] = recording.tool_results()
    assert result["content"] == "Spring tides are the highest.\n"  # only read_file was run here
    # The record: each use as a tool call with its pages, the citations, the price.
    calls = tool_calls(svc, step)
    assert [c["tool"] for c in calls] == ["web_search", "web_fetch", "web_search", "web_search", "read_file", "web_search"]
    assert [c["is_error"] for c in calls] == [False, False, False, True, False, False]
    spring = calls[0]["output"].splitlines()
    assert spring[:2] == ["1. spring tides - result 1", "   https://example.com/search/1?q=spring%20tides"]
    assert calls[1]["output"].splitlines() == ["1. Page at https://example.com/tides", "   https://example.com/tides"]
    assert calls[3]["output"] == "error: max_uses_exceeded"
    assert json.loads(calls[0]["input"]) == {"query": "spring tides"}
    first, second = web_events(step)
    assert (first["web_search_requests"], first["web_fetch_requests"]) == (2, 1)
    assert (second["web_search_requests"], second["web_fetch_requests"]) == (1, 0)
    cited = {(c["type"], c.get("url"), c.get("title")) for c in first["citations"]}
    assert ("web_search_result_location", "https://example.com/search/1?q=spring%20tides", "spring tides - result 1") in cited
    assert ("char_location", None, "Page at https://example.com/tides") in cited
    assert stats["web_search_requests"] == 3 and stats["web_fetch_requests"] == 1
    price = catalog().price(MODEL)
    assert price is not None
    tokens = sum(price.cost(call.tokens) for call in step.calls)
    assert [c.cost_usd for c in step.calls] == pytest.approx(
        [price.cost(step.calls[0].tokens) + 0.02, price.cost(step.calls[1].tokens) + 0.01]
    )
    assert step.cost_usd == pytest.approx(tokens + 0.03, abs=1e-6) and run.cost_usd == pytest.approx(tokens + 0.03, abs=1e-6)


def test_web_search_alone_goes_without_a_beta_and_a_final_reply_cites_its_page(on: ServicesOn, tmp_path: Path) -> None:
    agent_md = "---\ntools: [web_search]\n---\nYou scout.\n"
    ws = claude_workspace(tmp_path, agent_md, directives(("web_search", {"query": "tides"}), reply="The tides, cited."))
    recording = Recording()
    with MessagesImitation(api_keys={KEY}) as api:
        api.responder = recording
        svc = on(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=api.url)
        run = drive_claude(svc, api, ws)
        betas = [r["betas"] for r in api.received]
    assert run.status == RunStatus.completed, run.error
    [step] = run.steps
    assert step.conclusion == "The tides, cited." and len(recording.bodies) == 1  # searched and replied in one request
    assert betas == [[]]
    assert recording.bodies[0]["tools"] == [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
    [event] = web_events(step)
    assert [c["url"] for c in event["citations"]] == ["https://example.com/search/1?q=tides"]
    assert "cites https://example.com/search/1?q=tides" in next(e.text for e in step.events if e.data == event)


def test_a_turn_the_api_paused_is_sent_back_as_it_is_and_goes_on(tmp_path: Path) -> None:
    agent_md = "---\ntools: [web_search]\n---\nYou scout.\n"
    ws = claude_workspace(tmp_path, agent_md, "      Look it up.\n")

    def paused_once(body: dict[str, Any]) -> Reply:
        if len(body["messages"]) == 1:  # the API's server loop paused after one search
            return Reply(
                text="Searching.", server_uses=[{"name": "web_search", "input": {"query": "tides"}}], stop_reason="pause_turn"
            )
        return Reply(text="Done after the pause.")

    recording = Recording(paused_once)
    with MessagesImitation(api_keys={KEY}) as api, pytest.MonkeyPatch.context() as mp:
        api.responder = recording
        with services_on("sqlite", tmp_path, mp, ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=api.url) as svc:
            run = drive_claude(svc, api, ws)
            step = run.steps[0]
            calls = tool_calls(svc, step)
    assert run.status == RunStatus.completed, run.error
    assert step.conclusion == "Done after the pause." and len(recording.bodies) == 2
    paused = recording.bodies[1]["messages"][-1]  # sent back as it came, with no user turn after it
    assert paused["role"] == "assistant"
    assert [b["type"] for b in paused["content"]] == ["server_tool_use", "web_search_tool_result", "text"]
    assert [c["tool"] for c in calls] == ["web_search"] and [len(s.calls) for s in run.steps] == [2]


# -- laneflow check --------------------------------------------------------------------------


def test_check_takes_the_web_tools_and_refuses_web_max_uses_that_nothing_would_read(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    md = root / "agents" / "writer" / "agent.md"
    md.write_text("---\ntools: [web_search, web_fetch]\nweb_max_uses: 3\n---\nYou write.\n")
    assert [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"] == []
    md.write_text("---\ntools: [read_file]\nweb_max_uses: 3\n---\nYou write.\n")
    problems = {p.field: p.message for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert "no web tool" in problems["web_max_uses"] and "ignored" in problems["web_max_uses"]
    md.write_text("---\ntools: [web_serch]\nweb_max_uses: 0\n---\nYou write.\n")
    problems = {p.field: p.message for p in check_workspace(root) if p.file == "agents/writer/agent.md"}
    assert "did you mean 'web_search'" in problems["tools[0]"] and "web_search and web_fetch" in problems["tools[0]"]
    assert "greater than or equal to 1" in problems["web_max_uses"]
