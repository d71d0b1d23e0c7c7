"""`load_workspace` and `load_agent` reuse their last reading of a folder only while nothing
it read changed: every edit, addition and removal is seen at the next call, and an unchanged
folder is not read again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from laneflow.domain import agent as agent_module
from laneflow.domain import workspace as workspace_module
from laneflow.domain import workspace_files
from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.workspace import Agent, Workspace, load_agent, load_workspace


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The full readings of a workspace made (each call of the reader behind the cache)."""
    made: list[str] = []
    real = workspace_module._read_workspace

    def counting(root: str | Path, account: str | Path | None) -> object:
        made.append(str(root))
        return real(root, account)

    monkeypatch.setattr(workspace_module, "_read_workspace", counting)
    workspace_module._readings.clear()
    return made


@pytest.fixture
def reads(counted: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`counted`, with readings kept at once (the files here were written just now)."""
    monkeypatch.setattr(workspace_files, "SETTLED_NS", 0)
    return counted


def make(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "agents" / "writer").mkdir(parents=True)
    (ws / "knowledge").mkdir()
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nShared aaa.\n")
    (ws / "agents" / "writer" / "agent.md").write_text("---\ndescription: writes\n---\nYou write.\n")
    (ws / "knowledge" / "facts.md").write_text("The sky is blue.\n")
    return ws


def test_an_unchanged_workspace_is_read_once_and_each_caller_gets_its_own_model(tmp_path: Path, reads: list[str]) -> None:
    ws = make(tmp_path)
    first, second = load_workspace(ws), load_workspace(ws)
    assert len(reads) == 1
    assert first == second and first is not second
    assert [d.text for d in second.knowledge] == ["The sky is blue.\n"]


def test_an_edit_of_the_same_size_in_the_same_instant_is_seen(tmp_path: Path, reads: list[str]) -> None:
    ws = make(tmp_path)
    before = load_workspace(ws)
    md = ws / "AGENTS.md"
    stat = md.stat()
    md.write_text(md.read_text().replace("aaa", "bbb"))
    os.utime(md, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the modification time put back
    after = load_workspace(ws)
    assert "aaa" in before.instructions[-1].text and "bbb" in after.instructions[-1].text
    assert len(reads) == 2


def test_added_and_removed_files_and_agents_are_seen_at_the_next_call(tmp_path: Path, reads: list[str]) -> None:
    ws = make(tmp_path)
    load_workspace(ws)
    (ws / "knowledge" / "more.md").write_text("Grass is green.\n")
    (ws / "agents" / "editor").mkdir()
    (ws / "agents" / "editor" / "agent.md").write_text("---\ndescription: edits\n---\nYou edit.\n")
    grown = load_workspace(ws)
    assert [d.path for d in grown.knowledge] == ["knowledge/facts.md", "knowledge/more.md"]
    assert grown.agent_names == ["editor", "writer"]
    (ws / "knowledge" / "facts.md").unlink()
    (ws / "agents" / "writer" / "agent.md").unlink()
    shrunk = load_workspace(ws)
    assert [d.path for d in shrunk.knowledge] == ["knowledge/more.md"]
    assert shrunk.agent_names == ["editor"]
    assert len(reads) == 3


def test_the_account_file_is_part_of_the_reading(tmp_path: Path, reads: list[str]) -> None:
    ws = make(tmp_path)
    (tmp_path / "AGENTS.md").write_text("---\nmodel: claude-sonnet-4-6\n---\nAccount rules.\n")
    assert load_workspace(ws).instructions[0].text == "Account rules."
    (tmp_path / "AGENTS.md").write_text("---\nmodel: claude-sonnet-4-6\n---\nNew account rules.\n")
    assert load_workspace(ws).instructions[0].text == "New account rules."
    assert len(reads) == 2


def test_a_workspace_that_cannot_be_read_is_never_kept(tmp_path: Path, reads: list[str]) -> None:
    ws = make(tmp_path)
    (ws / "AGENTS.md").write_text("---\nmodel: [unclosed\n---\nBroken.\n")
    for _ in range(2):
        with pytest.raises(WorkspaceInvalid):
            load_workspace(ws)
    assert len(reads) == 2
    assert not len(workspace_module._readings)


@pytest.fixture
def agent_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    real = agent_module.read_agent

    def counting(ws: Workspace, name: str) -> Agent:
        made.append(name)
        return real(ws, name)

    monkeypatch.setattr(agent_module, "read_agent", counting)
    monkeypatch.setattr(workspace_files, "SETTLED_NS", 0)
    agent_module._agents.clear()
    workspace_module._readings.clear()
    return made


def test_an_unchanged_agent_is_read_once(tmp_path: Path, agent_reads: list[str]) -> None:
    ws = make(tmp_path)
    first = load_agent(load_workspace(ws), "writer")
    second = load_agent(load_workspace(ws), "writer")
    assert first == second and first is not second
    assert agent_reads == ["writer"]


def test_edits_to_an_agent_its_skills_and_the_shared_scripts_are_seen(tmp_path: Path, agent_reads: list[str]) -> None:
    ws = make(tmp_path)
    md = ws / "agents" / "writer" / "agent.md"
    assert load_agent(load_workspace(ws), "writer").persona.strip() == "You write."
    stat = md.stat()
    md.write_text(md.read_text().replace("write", "draft"))  # same size, same modification time
    os.utime(md, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_agent(load_workspace(ws), "writer").persona.strip() == "You draft."
    (ws / "agents" / "writer" / "skills" / "style").mkdir(parents=True)
    (ws / "agents" / "writer" / "skills" / "style" / "SKILL.md").write_text(
        "---\nname: style\ndescription: how to write\n---\nShort.\n"
    )
    assert [s.name for s in load_agent(load_workspace(ws), "writer").skills] == ["style"]
    (ws / "scripts").mkdir()
    tool = ws / "scripts" / "count.sh"
    tool.write_text("#!/bin/sh\n# counts words\nwc -w\n")
    tool.chmod(0o755)
    assert [t.name for t in load_agent(load_workspace(ws), "writer").script_tools] == ["script_count"]
    assert len(agent_reads) == 4


def test_a_change_to_the_workspace_reads_its_agents_afresh(tmp_path: Path, agent_reads: list[str]) -> None:
    ws = make(tmp_path)
    load_agent(load_workspace(ws), "writer")
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nShared, edited.\n")
    load_agent(load_workspace(ws), "writer")
    assert agent_reads == ["writer", "writer"]


def test_a_workspace_read_on_its_own_has_its_agents_read_afresh(tmp_path: Path, agent_reads: list[str]) -> None:
    ws = make(tmp_path)
    alone = workspace_module.read_workspace(ws)
    load_agent(alone, "writer")
    load_agent(alone, "writer")
    assert agent_reads == ["writer", "writer"]


def test_a_reading_of_files_changed_within_the_clocks_tick_is_not_kept(tmp_path: Path, counted: list[str]) -> None:
    # A coarse clock could give a rewrite of the same size the very same times: a reading of
    # files changed less than SETTLED_NS ago is used once, not kept.
    ws = make(tmp_path)
    load_workspace(ws)
    load_workspace(ws)
    assert len(counted) == 2 and not len(workspace_module._readings)
    assert workspace_files.settled(workspace_module._signature(ws.resolve(), None), time.time_ns() + workspace_files.SETTLED_NS)
