"""The file tools' own failures are errors the model is told (never a crash, never a local
path), and no agent can write an agent's definition or the read-only knowledge."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.executors.tools import MAX_READ_CHARS, FileTools, ToolError

AGENT_MD = "---\nmax_turns: 4\n---\nI write briefs."


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for rel, text in {
        "agents/writer/agent.md": AGENT_MD,
        "agents/writer/skills/tone/SKILL.md": "Be warm.",
        "agents/writer/scripts/count.sh": "#!/bin/sh\nwc -w\n",
        "agents/writer/knowledge/style.md": "Be brief.",
        "agents/writer/outputs/draft.md": "Draft.",
        "agents/other/agent.md": "---\n---\nOther.",
        "agents/other/notes.md": "not yours",
        "knowledge/facts.md": "Water is wet.",
        "storage/.keep": "",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def tools(ws: Path) -> FileTools:
    return FileTools(ws, "agents/writer")


def refusal(tools: FileTools, name: str, args: Any) -> str:
    with pytest.raises(ToolError) as caught:
        tools.run(name, args)
    message = str(caught.value)
    # Never a local absolute path in what the model is told.
    assert str(tools.root) not in message and str(tools.root.parent) not in message, message
    return message


# -- a tool's own failure is an error the model is told -------------------------------------


def test_a_folder_given_to_read_file_is_an_error_the_model_is_told(tools: FileTools) -> None:
    assert "a folder, not a file" in refusal(tools, "read_file", {"path": "storage"})
    assert "a folder, not a file" in refusal(tools, "read_file", {"path": "agents/writer/outputs/"})


def test_a_file_given_to_list_files_is_an_error_the_model_is_told(tools: FileTools) -> None:
    assert "a file, not a folder" in refusal(tools, "list_files", {"path": "knowledge/facts.md"})


def test_a_symlink_loop_is_an_error_without_a_local_path(ws: Path, tools: FileTools) -> None:
    (ws / "storage" / "loop").symlink_to(ws / "storage" / "loop")
    (ws / "storage" / "a").symlink_to(ws / "storage" / "b")
    (ws / "storage" / "b").symlink_to(ws / "storage" / "a")
    for name, args in (
        ("read_file", {"path": "storage/loop"}),
        ("read_file", {"path": "storage/a/x.md"}),
        ("write_file", {"path": "storage/loop", "content": "x"}),
        ("list_files", {"path": "storage/b"}),
    ):
        assert "symlink loop" in refusal(tools, name, args), (name, args)
    # A listing of the folder that holds the loops passes them over.
    assert tools.run("list_files", {"path": "storage"}) == "storage/.keep"


def test_a_nul_byte_in_a_path_is_an_error_the_model_is_told(tools: FileTools) -> None:
    assert "NUL" in refusal(tools, "read_file", {"path": "storage/a\x00b.md"})
    assert "NUL" in refusal(tools, "write_file", {"path": "storage/\x00", "content": "x"})


def test_a_5000_character_name_is_an_error_the_model_is_told_in_short(tools: FileTools) -> None:
    message = refusal(tools, "write_file", {"path": "storage/" + "n" * 5000 + ".md", "content": "x"})
    assert "too long" in message and len(message) < 400
    assert "too long" in refusal(tools, "read_file", {"path": "storage/" + "é" * 200})  # 400 bytes in one name


def test_a_non_utf8_file_is_an_error_naming_the_byte(ws: Path, tools: FileTools) -> None:
    (ws / "storage" / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    (ws / "storage" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert "not UTF-8 text (byte 3" in refusal(tools, "read_file", {"path": "storage/latin1.txt"})
    assert "not UTF-8 text (byte 0" in refusal(tools, "read_file", {"path": "storage/image.png"})


def test_a_read_cut_at_its_limit_keeps_whole_characters(ws: Path, tools: FileTools) -> None:
    (ws / "storage" / "long.md").write_text("é" * (MAX_READ_CHARS * 3))  # 2 bytes each: cut mid-file
    text = tools.run("read_file", {"path": "storage/long.md"})
    assert text == "é" * MAX_READ_CHARS + "\n[truncated]"


def test_a_fifo_is_refused_without_blocking_the_step(ws: Path, tools: FileTools) -> None:
    os.mkfifo(ws / "storage" / "pipe")
    assert "not a regular file" in refusal(tools, "read_file", {"path": "storage/pipe"})


@pytest.mark.parametrize(
    "name, args, said",
    [
        ("read_file", ["storage/x"], "JSON object"),
        ("read_file", "storage/x", "JSON object"),
        ("read_file", None, "JSON object"),
        ("read_file", {"path": 7}, "non-empty string"),
        ("read_file", {"path": ["storage/x"]}, "non-empty string"),
        ("list_files", {}, "non-empty string"),
        ("write_file", {"path": "storage/x.md"}, "content must be a string"),
        ("write_file", {"path": "storage/x.md", "content": {"text": "x"}}, "content must be a string"),
        ("write_file", {"content": "x"}, "non-empty string"),
        ("write_file", {"path": "storage/x.md", "content": "\ud800"}, "lone surrogate"),
        ("read_file", {"path": "storage/\udcff"}, "lone surrogate"),
        ("rm_file", {"path": "storage/x.md"}, "no tool"),
    ],
)
def test_missing_or_ill_typed_arguments_are_errors_the_model_is_told(
    ws: Path, tools: FileTools, name: str, args: Any, said: str
) -> None:
    assert said in refusal(tools, name, args)
    assert sorted(p.name for p in (ws / "storage").iterdir()) == [".keep"]  # nothing written


def test_a_write_where_a_folder_is_or_through_a_file_is_an_error(ws: Path, tools: FileTools) -> None:
    assert "a folder, not a file" in refusal(tools, "write_file", {"path": "storage", "content": "x"})
    assert "a folder on the way is a file" in refusal(
        tools, "write_file", {"path": "agents/writer/outputs/draft.md/x.md", "content": "x"}
    )


def test_a_refused_write_leaves_the_old_file_whole_and_no_scratch_file(ws: Path, tools: FileTools) -> None:
    refusal(tools, "write_file", {"path": "agents/writer/outputs/draft.md", "content": "half\ud800"})
    assert (ws / "agents/writer/outputs/draft.md").read_text() == "Draft."
    tools.run("write_file", {"path": "agents/writer/outputs/draft.md", "content": "Second draft."})
    assert (ws / "agents/writer/outputs/draft.md").read_text() == "Second draft."
    assert sorted(p.name for p in (ws / "agents/writer/outputs").iterdir()) == ["draft.md"]


# -- an agent cannot rewrite itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "agents/writer/agent.md",
        "agents/writer/Agent.MD",
        "./agents/writer/agent.md",
        "agents/writer/skills/tone/SKILL.md",
        "agents/writer/skills/new.md",
        "agents/writer/skills",
        "agents/writer/scripts/count.sh",
        "agents/writer/scripts/new.sh",
        "agents/writer/Scripts/new.sh",
    ],
)
def test_an_agent_cannot_write_its_own_definition(ws: Path, tools: FileTools, path: str) -> None:
    assert "cannot rewrite itself" in refusal(
        tools, "write_file", {"path": path, "content": "---\nmax_turns: 99\n---\nRewritten."}
    )
    assert (ws / "agents/writer/agent.md").read_text() == AGENT_MD
    assert (ws / "agents/writer/skills/tone/SKILL.md").read_text() == "Be warm."
    assert not (ws / "agents/writer/skills/new.md").exists() and not (ws / "agents/writer/scripts/new.sh").exists()


def test_a_link_in_its_own_outputs_does_not_lead_to_its_definition(ws: Path, tools: FileTools) -> None:
    (ws / "agents/writer/outputs/me.md").symlink_to(ws / "agents/writer/agent.md")
    (ws / "agents/writer/outputs/skills").symlink_to(ws / "agents/writer/skills", target_is_directory=True)
    assert "cannot rewrite itself" in refusal(tools, "write_file", {"path": "agents/writer/outputs/me.md", "content": "x"})
    assert "cannot rewrite itself" in refusal(
        tools, "write_file", {"path": "agents/writer/outputs/skills/evil.md", "content": "x"}
    )
    assert (ws / "agents/writer/agent.md").read_text() == AGENT_MD
    # Reading its own definition is allowed: it is what the agent is.
    assert tools.run("read_file", {"path": "agents/writer/outputs/me.md"}) == AGENT_MD


@pytest.mark.parametrize(
    "path",
    [
        "knowledge/facts.md",
        "knowledge/new.md",
        "Knowledge/new.md",
        "agents/writer/knowledge/style.md",
        "agents/writer/knowledge/new.md",
    ],
)
def test_knowledge_folders_are_read_only(ws: Path, tools: FileTools, path: str) -> None:
    message = refusal(tools, "write_file", {"path": path, "content": "x"})
    assert "read-only" in message or "not in your folder" in message
    assert (ws / "knowledge/facts.md").read_text() == "Water is wet." and not (ws / "knowledge/new.md").exists()


def test_another_agents_folder_cannot_be_read_listed_or_written(ws: Path, tools: FileTools) -> None:
    (ws / "agents/writer/outputs/theirs").symlink_to(ws / "agents/other", target_is_directory=True)
    (ws / "agents/writer/outputs/their-agent.md").symlink_to(ws / "agents/other/agent.md")
    for name, args in (
        ("read_file", {"path": "agents/other/notes.md"}),
        ("read_file", {"path": "agents/other/agent.md"}),
        ("write_file", {"path": "agents/other/agent.md", "content": "x"}),
        ("write_file", {"path": "agents/other/skills/new.md", "content": "x"}),
        ("list_files", {"path": "agents/other"}),
        ("list_files", {"path": "agents"}),
        ("read_file", {"path": "agents/writer/outputs/theirs/notes.md"}),
        ("write_file", {"path": "agents/writer/outputs/their-agent.md", "content": "x"}),
        ("write_file", {"path": "agents/writer/outputs/theirs/agent.md", "content": "x"}),
        ("read_file", {"path": "agents/writer/../other/notes.md"}),
    ):
        message = refusal(tools, name, args)
        assert "not in your folder" in message or "stay inside" in message, (name, args, message)
    assert (ws / "agents/other/agent.md").read_text() == "---\n---\nOther."
    assert not (ws / "agents/other/skills").exists()
    # A listing of its own folder shows no file through those links.
    listed = tools.run("list_files", {"path": "agents/writer"}).splitlines()
    assert not any("theirs" in line or "their-agent" in line for line in listed)
    assert "agents/writer/agent.md" in listed
