"""The reach's prompt layers (`delegates`, `mcp`, `web`, `finding`) are real layers: stable
(before the cache breakpoint), sized and hashed, changed only when what they describe
changes, and named by a step's cache_break when one of them is what differs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from helpers import write_workspace

from laneflow.domain.lanes_report import cache_break
from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.records import ModelCall, PromptLayer, Step, StepStatus, Tokens
from laneflow.domain.workspace import load_agent, load_workspace

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)

BOSS: dict[str, Any] = {
    "delegates": ["helper"],
    "tools": ["search", "history", "web_search"],
    "web_max_uses": 3,
    "mcp": [{"name": "tides", "command": "python3", "args": ["servers/tides.py"]}],
}


def layers_of(root: Path, boss: dict[str, Any], helper: dict[str, Any]) -> list[PromptLayer]:
    ws_root = write_workspace(
        root / "ws", {"boss": boss, "helper": helper}, {"f": {"description": "x", "steps": [{"agent": "boss"}]}}
    )
    ws = load_workspace(ws_root)
    return build_system_prompt(ws, load_agent(ws, "boss"), now=NOW).records()


def earlier_step(layers: list[PromptLayer]) -> Step:
    return Step(
        index=0,
        group=0,
        agent="boss",
        model="claude-sonnet-4-6",
        status=StepStatus.completed,
        prompt_layers=layers,
        prefix={"tokens": 5000, "tools": "t"},
        calls=[ModelCall(id="c", tokens=Tokens(cache_write=5000))],
    )


@pytest.mark.parametrize(
    ("layer", "boss", "helper"),
    [
        ("delegates", BOSS, {"description": "does other things now"}),
        ("mcp", {**BOSS, "mcp": [{"name": "tides", "url": "https://mcp.example.com/mcp"}]}, {"description": "helps"}),
        ("web", {**BOSS, "web_max_uses": 4}, {"description": "helps"}),
        ("finding", {**BOSS, "tools": ["search", "web_search"]}, {"description": "helps"}),
    ],
)
def test_a_change_to_what_a_reach_layer_describes_is_named_by_the_cache_break(
    tmp_path: Path, layer: str, boss: dict[str, Any], helper: dict[str, Any]
) -> None:
    before = layers_of(tmp_path / "before", BOSS, {"description": "helps"})
    again = layers_of(tmp_path / "again", BOSS, {"description": "helps"})
    after = layers_of(tmp_path / "after", boss, helper)
    named = {record.name: record for record in before}
    assert {"delegates", "mcp", "web", "finding"} <= set(named)
    assert not any(named[n].dynamic for n in ("delegates", "mcp", "web", "finding"))
    assert again == before  # stable: the same workspace gives the same layers
    changed = [record.name for record in after if record not in before]
    assert changed == [layer]
    found = cache_break(
        model="claude-sonnet-4-6", layers=after, prefix={"tokens": 5000, "tools": "t"}, earlier=[("run-1", earlier_step(before))]
    )
    assert found == {"layer": layer, "since": "run-1/0"}
