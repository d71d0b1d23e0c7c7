"""File tools stay inside the agent's folder and the shared folders; prices come from the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.executors.tools import FileTools, ToolError
from laneflow.domain.pricing import catalog
from laneflow.domain.records import Tokens


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    for rel, text in {
        "agents/writer/agent.md": "---\n---\nWriter.",
        "agents/writer/knowledge/style.md": "Be brief.",
        "agents/other/secret.md": "not yours",
        "knowledge/facts.md": "Water is wet.",
        "storage/.keep": "",
    }.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path.parent / "outside.txt").write_text("outside")
    return tmp_path


def test_tools_are_defined_in_a_stable_sorted_order(ws: Path) -> None:
    names = [d["name"] for d in FileTools(ws, "agents/writer").definitions()]
    assert names == ["list_files", "read_file", "write_file"]
    assert [d["name"] for d in FileTools(ws, "agents/writer").definitions(("write_file", "read_file"))] == [
        "read_file",
        "write_file",
    ]


def test_read_list_and_write_inside_own_and_shared_folders(ws: Path) -> None:
    tools = FileTools(ws, "agents/writer")
    assert tools.run("read_file", {"path": "knowledge/facts.md"}) == "Water is wet."
    assert tools.run("read_file", {"path": "agents/writer/knowledge/style.md"}) == "Be brief."
    assert "wrote 5 characters" in tools.run("write_file", {"path": "storage/brief.md", "content": "Brief"})
    assert (ws / "storage" / "brief.md").read_text() == "Brief"
    tools.run("write_file", {"path": "agents/writer/outputs/draft.md", "content": "Draft"})
    assert "agents/writer/outputs/draft.md" in tools.run("list_files", {"path": "agents/writer"})


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("read_file", {"path": "agents/other/secret.md"}, "not in your folder"),
        ("read_file", {"path": "../outside.txt"}, "stay inside"),
        ("read_file", {"path": "/etc/passwd"}, "stay inside"),
        ("write_file", {"path": "knowledge/facts.md", "content": "x"}, "read-only"),
        ("write_file", {"path": "agents/writer/knowledge/style.md", "content": "x"}, "read-only"),
        ("read_file", {"path": "storage/missing.md"}, "no such file"),
        ("read_file", {}, "non-empty string"),
        ("delete_file", {"path": "storage/x"}, "no tool"),
    ],
)
def test_what_a_tool_may_not_do_is_an_error_the_model_is_told(ws: Path, name: str, args: Any, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        FileTools(ws, "agents/writer").run(name, args)


def test_a_symlink_out_of_the_workspace_is_refused(ws: Path) -> None:
    (ws / "storage" / "escape").symlink_to(ws.parent)
    with pytest.raises(ToolError):
        FileTools(ws, "agents/writer").run("read_file", {"path": "storage/escape/outside.txt"})


def test_cost_counts_cache_writes_and_reads_at_their_own_prices() -> None:
    price = catalog().price("claude-sonnet-4-5")
    assert price is not None
    tokens = Tokens(input=1_000_000, output=1_000_000, cache_write=1_000_000, cache_read=1_000_000)
    assert price.cost(tokens) == pytest.approx(3.0 + 15.0 + 3.75 + 0.30)
    assert price.cost(Tokens(cache_write=1_000_000), cache_ttl="1h") == pytest.approx(6.0)


def test_dated_model_ids_find_their_family_price_and_unknown_ones_none() -> None:
    assert catalog().price("claude-sonnet-4-5-20250929") == catalog().price("claude-sonnet-4-5")
    dated, family = catalog().price("claude-opus-4-1-20250805"), catalog().price("claude-opus-4")
    assert dated is not None and dated.input == 15.0
    assert family is not None and family.input == 15.0
    assert catalog().price("gpt-4") is None
