"""The `web` layer: how to use the web tools, only when the agent has one, stable (cached),
naming its `web_max_uses`; agent.md's `web_max_uses` read and checked."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.workspace import load_agent, load_workspace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

NOW = dt.datetime(2026, 3, 2, 9, 30, tzinfo=dt.UTC)


def workspace(tmp_path: Path, front: str) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "agents" / "researcher" / "agent.md").write_text(f"---\n{front}---\nYou research.\n")
    return root


def layers(root: Path, now: dt.datetime = NOW) -> dict[str, tuple[str, bool]]:
    ws = load_workspace(root)
    prompt = build_system_prompt(ws, load_agent(ws, "researcher"), now=now)
    return {layer.name: (layer.text, layer.dynamic) for layer in prompt.layers}


def test_the_web_layer_says_how_to_use_the_granted_web_tools_stable_and_small(tmp_path: Path) -> None:
    text, dynamic = layers(workspace(tmp_path / "both", "tools: [web_search, web_fetch]\nweb_max_uses: 3\n"))["web"]
    assert not dynamic and "`web_search" in text and "`web_fetch" in text and "at most 3 times a turn" in text
    assert len(text) < 800
    only = layers(workspace(tmp_path / "search", "tools: [web_search]\n"))["web"][0]
    assert "`web_search" in only and "`web_fetch" not in only and "at most 5 times" in only  # the default
    assert "web" not in layers(workspace(tmp_path / "none", "tools: [read_file]\n"))
    later = layers(workspace(tmp_path / "both2", "tools: [web_search, web_fetch]\nweb_max_uses: 3\n"), NOW + dt.timedelta(days=9))
    assert later["web"][0] == text  # the same text on another day: it stays cached


@pytest.mark.parametrize("value", ["0", "2.5", "'3'", "true"])
def test_web_max_uses_takes_a_whole_number_from_one(tmp_path: Path, value: str) -> None:
    root = workspace(tmp_path, f"tools: [web_search]\nweb_max_uses: {value}\n")
    with pytest.raises(WorkspaceInvalid) as exc:
        load_agent(load_workspace(root), "researcher")
    assert [p.field for p in exc.value.problems] == ["web_max_uses"]


def test_web_max_uses_on_an_agent_without_a_web_tool_is_a_problem(tmp_path: Path) -> None:
    root = workspace(tmp_path, "tools: [read_file]\nweb_max_uses: 2\n")
    with pytest.raises(WorkspaceInvalid) as exc:
        load_agent(load_workspace(root), "researcher")
    [problem] = exc.value.problems
    assert problem.field == "web_max_uses" and problem.line == 3 and "would be ignored" in problem.message
