"""`mcp:` entries checked (domain/mcp.py): each refusal names the file, the entry's line and
its field, with the closest key for an unknown one; a workspace's servers merged under an
agent's own; the tools' names; the prompt layer; `laneflow check` on AGENTS.md and agent.md."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from laneflow.domain.entries import fill_secrets
from laneflow.domain.flow import check_workspace
from laneflow.domain.mcp import McpServer, check_mcp, layer_text, merged, tool_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

LINES = {"mcp": 3, "mcp[0]": 4, "mcp[0].name": 4, "mcp[0].env.TOKEN": 7, "mcp[1]": 9}


def refusals(raw: Any, secrets: Any = ("TOKEN", "@CERT")) -> dict[str, str]:
    specs, problems = check_mcp(raw, rel="agents/a/agent.md", lines=LINES, secrets=list(secrets))
    assert not (specs and len(specs) == len(raw) and problems)
    return {str(p.field): p.message for p in problems}


def test_a_stdio_and_an_http_server_are_taken() -> None:
    raw = [
        {"name": "echo", "command": "python3", "args": ["-m", "echo"], "env": {"KEY": "${TOKEN}", "N": 3}},
        {"name": "web.docs", "url": "https://mcp.example.com/mcp?v=1", "headers": {"Authorization": "Bearer ${TOKEN}"}},
    ]
    specs, problems = check_mcp(raw, rel="agents/a/agent.md", lines=LINES, secrets=["TOKEN"])
    assert problems == []
    echo, web = specs
    assert (echo.command, echo.args, echo.env, echo.url) == ("python3", ["-m", "echo"], {"KEY": "${TOKEN}", "N": "3"}, None)
    assert (web.url, web.command, web.secret_names) == ("https://mcp.example.com/mcp?v=1", None, ["TOKEN"])
    assert web.prefix == "mcp__web_docs__"


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"command": "x"}, "mcp[0].name", "needs 'name:'"),
        ({"name": "e"}, "mcp[0].command", "needs 'command:'"),
        ({"name": "e", "command": "x", "url": "http://h"}, "mcp[0].url", "not both"),
        ({"name": "e", "command": "x", "agrs": []}, "mcp[0].agrs", "did you mean 'args'?"),
        ({"name": "e", "url": "http://h", "header": {}}, "mcp[0].header", "did you mean 'headers'?"),
        ({"name": "e", "command": "x", "headers": {}}, "mcp[0].headers", "belongs to an endpoint"),
        ({"name": "e", "url": "http://h", "env": {}}, "mcp[0].env", "belongs to a program"),
        ({"name": "e", "command": "x", "env": {"TOKEN": "${NOPE}"}}, "mcp[0].env.TOKEN", "not in this agent's secrets"),
        ({"name": "e", "command": "x", "env": {"TOKEN": "${TOKN}"}}, "mcp[0].env.TOKEN", "did you mean 'TOKEN'?"),
        ({"name": "e", "command": "x", "env": {"TOKEN": "${CERT}"}}, "mcp[0].env.TOKEN", "declared as a file"),
        ({"name": "e", "url": "http://h", "headers": {"A": "${NOPE}"}}, "mcp[0].headers.A", "not in this agent's secrets"),
        ({"name": "e", "command": "x", "args": ["${TOKEN}"]}, "mcp[0].args", "cannot name a secret"),
        ({"name": "e", "command": "x", "args": "-v"}, "mcp[0].args", "a list of strings"),
        ({"name": "e", "command": 3}, "mcp[0].command", "a program's name or path"),
        ({"name": "e", "url": "ftp://h"}, "mcp[0].url", "http:// or https://"),
        ({"name": "e", "url": "https://u:p@h/mcp"}, "mcp[0].url", "user or password"),
        ({"name": "e", "url": "http://h", "headers": {"A": "x\r\ny"}}, "mcp[0].headers.A", "line break"),
        ({"name": "e", "url": "http://h", "headers": ["A"]}, "mcp[0].headers", "a mapping"),
        ({"name": "e", "command": "x", "env": {"1X": "v"}}, "mcp[0].env.1X", "not an environment variable's name"),
        ({"name": "e", "command": "x", "env": {"X": True}}, "mcp[0].env.X", "a value is text"),
        ({"name": ["e"], "command": "x"}, "mcp[0].name", "name is text"),
        ("echo", "mcp[0]", "is a mapping"),
    ],
)
def test_a_refused_entry_names_its_field_and_why(entry: Any, field: str, words: str) -> None:
    found = refusals([entry])
    assert field in found, found
    assert words in found[field]


def test_a_refusal_carries_the_entrys_line() -> None:
    _, problems = check_mcp([{"command": "x"}], rel="agents/a/agent.md", lines=LINES, secrets=[])
    [problem] = problems
    assert (problem.file, problem.line, problem.field) == ("agents/a/agent.md", 4, "mcp[0].name")
    _, problems = check_mcp("echo", rel="AGENTS.md", lines=LINES, secrets=None)
    assert [(p.field, p.line) for p in problems] == [("mcp", 3)]


def test_two_names_that_would_name_the_same_tools_are_refused() -> None:
    found = refusals([{"name": "a.b", "command": "x"}, {"name": "a_b", "command": "y"}])
    assert "listed twice" in found["mcp[1].name"]


def test_agents_md_entries_are_not_checked_for_secrets_until_an_agent_keeps_them() -> None:
    raw = [{"name": "echo", "command": "x", "env": {"K": "${TOKEN}"}}, {"name": "web", "url": "http://h"}]
    shared, problems = check_mcp(raw, rel="AGENTS.md", lines={}, secrets=None)
    assert problems == [] and len(shared) == 2
    own = [McpServer(name="echo", command="mine")]
    servers, problems = merged(shared, own, secrets=[], rel="AGENTS.md", agent="a")
    assert [(s.name, s.command or s.url) for s in servers] == [("web", "http://h"), ("echo", "mine")]
    assert problems == []  # the agent's own echo replaces the one naming TOKEN
    servers, problems = merged(shared, [], secrets=[], rel="AGENTS.md", agent="a")
    [problem] = problems
    assert (problem.file, problem.field) == ("AGENTS.md", "mcp[0].env.K")
    assert "not in agent a's secrets" in problem.message


def test_tool_names_are_safe_and_cut_to_what_the_api_takes() -> None:
    assert tool_name("web docs", "search.v2") == "mcp__web_docs__search_v2"
    assert len(tool_name("s", "t" * 100)) == 64


def test_secrets_are_filled_and_the_layer_names_no_value() -> None:
    spec = McpServer(name="web", url="https://h/mcp?key=1", headers={"Authorization": "Bearer ${TOKEN}"})
    assert fill_secrets(spec.headers, {"TOKEN": "v"}) == {"Authorization": "Bearer v"}
    text = layer_text([spec, McpServer(name="echo", command="python3", env={"K": "${TOKEN}"})])
    assert "- mcp__web__*: the MCP server at https://h/mcp" in text
    assert "- mcp__echo__*: the program python3" in text
    assert "TOKEN" not in text and "key=1" not in text
    assert layer_text([]) == ""


def test_check_reports_agents_md_and_agent_md_entries_with_their_lines(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    agents_md = root / "AGENTS.md"
    front, body = agents_md.read_text().split("---\n", 2)[1:]
    agents_md.write_text(f"---\n{front}mcp:\n  - name: shared\n    comand: x\n---\n{body}")
    md = root / "agents" / "writer" / "agent.md"
    md.write_text("---\nmcp:\n  - name: own\n    url: http://h\n    headers: {A: '${NOPE}'}\n---\nYou write.\n")
    problems = {(p.file, p.field): p for p in check_workspace(root)}
    shared = problems[("AGENTS.md", "mcp[0].comand")]
    assert "did you mean 'command'?" in shared.message
    assert shared.line == front.count("\n") + 4
    own = problems[("agents/writer/agent.md", "mcp[0].headers.A")]
    assert own.line == 5 and "not in this agent's secrets" in own.message


def test_an_mcp_of_the_wrong_type_is_one_problem_naming_the_setting(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "agents" / "writer" / "agent.md").write_text("---\nmcp: 3\n---\nYou write.\n")
    problems = [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"]
    assert [(p.field, p.line) for p in problems] == [("mcp", 2)]
    assert "expected a list" in problems[0].message


def test_an_mcp_tool_named_in_tools_is_refused_saying_its_entry_grants_it(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "agents" / "writer" / "agent.md").write_text("---\ntools: [mcp__echo__echo]\n---\nYou write.\n")
    [problem] = [p for p in check_workspace(root) if p.file == "agents/writer/agent.md"]
    assert problem.field == "tools[0]" and "come from its mcp: entry alone" in problem.message
