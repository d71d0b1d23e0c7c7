"""Reading a workspace: frontmatter (strict, then lenient), settings, account merge,
skills, documents and the revision hash."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from laneflow.domain import frontmatter
from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.workspace import load_agent, load_workspace, read_frontmatter, workspace_revision

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WS_OK = FIXTURES / "ws_ok"
WS_BROKEN = FIXTURES / "ws_broken"


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def agent_ws(tmp_path: Path, agent_md: str, **more: str) -> Path:
    return write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": agent_md, **more})


# --------------------------------------------------------------------------- workspace


def test_ok_fixture_reads_settings_instructions_documents_and_names() -> None:
    ws = load_workspace(WS_OK)

    assert ws.name == "ws_ok"
    assert ws.root == WS_OK
    assert ws.account_root is None
    assert ws.settings.model == "claude-sonnet-4-5"
    assert ws.settings.judge == {"model": "claude-haiku-4-5"}
    assert ws.settings.budget == 2.0
    assert [d.path for d in ws.instructions] == ["AGENTS.md"]
    assert ws.instructions[0].text == "Write plainly. Cite sources."
    assert [d.path for d in ws.knowledge] == ["knowledge/style.md"]
    assert [d.path for d in ws.memory] == ["memory/feedback.md"]
    assert [d.path for d in ws.state] == ["state/cursor.json"]
    assert ws.agent_names == ["checker", "notifier", "publisher", "rescuer", "researcher", "writer"]
    assert ws.flow_names == ["brief", "inline"]
    assert ws.warnings == []


def test_missing_workspace_raises_naming_the_path_given(tmp_path: Path) -> None:
    given = tmp_path / "nowhere"
    with pytest.raises(WorkspaceInvalid) as e:
        load_workspace(given)
    assert str(given) in str(e.value)


def test_folder_without_agents_md_agents_or_flows_is_not_a_workspace(tmp_path: Path) -> None:
    write(tmp_path / "plain", {"notes.txt": "hello"})
    with pytest.raises(WorkspaceInvalid, match="not a laneflow workspace"):
        load_workspace(tmp_path / "plain")


def test_account_settings_fill_gaps_field_by_field_and_judge_inside(tmp_path: Path) -> None:
    # Given an account AGENTS.md in the workspace's parent folder
    write(
        tmp_path,
        {
            "AGENTS.md": "---\nmodel: account-model\ncapture: metadata\nlocale: fr-FR\n"
            "judge:\n  model: account-judge\n  effort: high\n---\nAccount rules.\n",
            "ws/AGENTS.md": "---\nmodel: ws-model\nbudget: 3\njudge:\n  model: ws-judge\n---\nWorkspace rules.\n",
            "ws/agents/a/agent.md": "persona",
        },
    )
    ws = load_workspace(tmp_path / "ws")

    assert ws.account_root == tmp_path.resolve()
    assert ws.settings.model == "ws-model"  # the workspace wins
    assert ws.settings.capture == "metadata"  # the account fills the gap
    assert ws.settings.locale == "fr-FR"
    assert ws.settings.budget == 3
    assert ws.settings.judge == {"model": "ws-judge", "effort": "high"}  # field by field inside
    assert [d.path for d in ws.instructions] == ["../AGENTS.md", "AGENTS.md"]
    assert [d.text for d in ws.instructions] == ["Account rules.", "Workspace rules."]


def test_explicit_account_folder_is_used_over_the_parent(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "AGENTS.md": "---\nmodel: parent\n---\n",
            "acct/AGENTS.md": "---\nmodel: explicit\n---\n",
            "ws/flows/x.yaml": "steps: []\n",
        },
    )
    ws = load_workspace(tmp_path / "ws", account=tmp_path / "acct")
    assert ws.settings.model == "explicit"
    assert ws.instructions == []  # empty bodies are left out


def test_explicit_account_without_agents_md_is_refused(tmp_path: Path) -> None:
    write(tmp_path, {"ws/AGENTS.md": "", "acct/readme.txt": ""})
    with pytest.raises(WorkspaceInvalid, match="no account AGENTS.md"):
        load_workspace(tmp_path / "ws", account=tmp_path / "acct")


def test_workspace_setting_of_the_wrong_type_names_file_line_and_field(tmp_path: Path) -> None:
    write(tmp_path / "ws", {"AGENTS.md": "---\nmodel: m\ncapture: everything\n---\n"})
    with pytest.raises(WorkspaceInvalid) as e:
        load_workspace(tmp_path / "ws")
    [problem] = e.value.problems
    assert (problem.file, problem.line, problem.field) == ("AGENTS.md", 3, "capture")
    assert "'full', 'metadata'" in problem.message


# --------------------------------------------------------------------------- frontmatter


def test_strict_frontmatter_gives_typed_settings_and_no_warnings(tmp_path: Path) -> None:
    ws_root = agent_ws(
        tmp_path,
        "---\nmodel: m1\ntools: [read_file, write_file]\nbudget: 0.5\ntimeout: 30\nmax_turns: 4\n"
        "sandbox: true\nsecrets: [API_KEY]\nstub: [one, two]\n---\n\nYou are A.\n",
    )
    agent = load_agent(load_workspace(ws_root), "a")

    s = agent.settings
    assert (s.model, s.tools, s.budget, s.timeout, s.max_turns) == ("m1", ["read_file", "write_file"], 0.5, 30.0, 4)
    assert s.sandbox is True and s.secrets == ["API_KEY"] and s.stub == ["one", "two"]
    assert agent.persona == "You are A."
    assert agent.warnings == []


def test_value_with_colon_is_read_leniently_with_a_warning_and_the_same_result_each_time(tmp_path: Path) -> None:
    ws_root = agent_ws(
        tmp_path,
        "---\nmodel: m1\ndescription: Use when: the user asks # why\n---\nPersona.\n",
    )
    ws = load_workspace(ws_root)

    first, second = load_agent(ws, "a"), load_agent(ws, "a")

    assert first.settings.description == "Use when: the user asks"
    [warning] = first.warnings
    assert (warning.severity, warning.file, warning.line, warning.field) == ("warning", "agents/a/agent.md", 3, "description")
    assert "leniently" in warning.message
    assert second == first  # every read parses afresh: same bytes, same result


def test_lenient_read_leaves_block_scalars_and_quoted_values_alone(tmp_path: Path) -> None:
    path = (
        write(
            tmp_path,
            {"x.md": '---\nnote: |\n  Keep: this: as is\nq: "a: b"\nd: Use when: asked\n---\nbody'},
        )
        / "x.md"
    )
    data, body, warnings = read_frontmatter(path, "x.md")
    assert data == {"note": "Keep: this: as is\n", "q": "a: b", "d": "Use when: asked"}
    assert body == "body"
    assert [w.line for w in warnings] == [5]


def test_malformed_agent_md_raises_naming_the_file_and_its_line() -> None:
    ws = load_workspace(WS_BROKEN)
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(ws, "broken")
    [problem] = e.value.problems
    assert problem.file == "agents/broken/agent.md"
    # Line 3 opens `tools: [read, write` and line 4 is where YAML gives up; the count
    # includes the opening `---` line.
    assert problem.line == 4
    assert "started on line 3" in problem.message


def test_error_line_counts_leading_blank_lines_and_the_opening_dashes(tmp_path: Path) -> None:
    # Lines: 1-2 blank, 3 `---`, 4 blank, 5 `model: m`, 6 the mis-indented key.
    ws_root = agent_ws(tmp_path, "\n\n---\n\nmodel: m\n  indented: wrong\n---\nbody\n")
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    [problem] = e.value.problems
    assert problem.line == 6
    assert not Path(problem.file).is_absolute()


def test_frontmatter_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "---\n- just\n- a list\n---\nbody\n")
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    assert "must be a mapping" in e.value.problems[0].message


def test_unclosed_frontmatter_is_an_error_not_an_empty_agent(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "---\nmodel: m\nYou are A.\n")
    with pytest.raises(WorkspaceInvalid, match="never closed"):
        load_agent(load_workspace(ws_root), "a")


def test_agent_setting_of_the_wrong_type_names_file_line_and_field(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "---\nmodel: m\ntools: read\nbudget: lots\n---\nbody\n")
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    found = {(p.file, p.line, p.field) for p in e.value.problems}
    assert found == {("agents/a/agent.md", 3, "tools"), ("agents/a/agent.md", 4, "budget")}
    assert "a list of strings" in str(e.value)


def test_unknown_agent_setting_is_a_warning_with_the_closest_field(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "---\nmodle: m\n---\nbody\n")
    agent = load_agent(load_workspace(ws_root), "a")
    [warning] = agent.warnings
    assert warning.severity == "warning" and warning.line == 2
    assert "did you mean 'model'?" in warning.message


def test_agent_md_that_is_not_utf8_is_a_problem(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "x")
    (ws_root / "agents/a/agent.md").write_bytes(b"---\nmodel: m\n---\n\xff\xfe bad\n")
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    assert e.value.problems[0].file == "agents/a/agent.md"
    assert "UTF-8" in e.value.problems[0].message


# --------------------------------------------------------------------------- agents


def test_agent_reads_skills_in_both_layouts_memory_knowledge_and_scripts() -> None:
    agent = load_agent(load_workspace(WS_OK), "researcher")

    assert agent.path == "agents/researcher"
    assert {(s.name, s.path) for s in agent.skills} == {
        ("web-search", "agents/researcher/skills/web-search/SKILL.md"),
        ("summarize", "agents/researcher/skills/summarize.md"),
    }
    assert {s.name: s.description for s in agent.skills}["summarize"] == "Summarize a source in three lines."
    assert [d.path for d in agent.memory] == ["agents/researcher/memory/notes.md"]
    assert [d.path for d in agent.knowledge] == ["agents/researcher/knowledge/sources.md"]
    assert agent.scripts == ["agents/researcher/scripts/fetch.sh"]


def test_malformed_skill_fails_its_agent_naming_the_skill_file(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "persona", **{"agents/a/skills/s/SKILL.md": "---\nname: [s\n---\n"})
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    assert e.value.problems[0].file == "agents/a/skills/s/SKILL.md"


def test_unknown_agent_is_refused() -> None:
    with pytest.raises(WorkspaceInvalid, match=r"no agent 'x' \(agents/x/agent.md not found\)"):
        load_agent(load_workspace(WS_OK), "x")


def test_agent_is_read_afresh_after_an_edit(tmp_path: Path) -> None:
    ws_root = agent_ws(tmp_path, "---\nmodel: one\n---\n")
    ws = load_workspace(ws_root)
    assert load_agent(ws, "a").settings.model == "one"
    (ws_root / "agents/a/agent.md").write_text("---\nmodel: two\n---\n")
    assert load_agent(ws, "a").settings.model == "two"


def test_an_edit_of_the_same_size_and_mtime_is_seen_at_once(tmp_path: Path) -> None:
    """The parse of a file is reused only for the very same bytes: an edit that keeps the
    file's size and its modification time (a coarse clock, a copy that keeps times) is seen."""
    ws_root = agent_ws(tmp_path, "---\nmodel: one\n---\nPersona A.\n")
    md = ws_root / "agents/a/agent.md"
    ws = load_workspace(ws_root)
    assert load_agent(ws, "a").settings.model == "one"
    before = md.stat()
    md.write_text("---\nmodel: two\n---\nPersona B.\n")
    os.utime(md, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert md.stat().st_size == before.st_size and md.stat().st_mtime_ns == before.st_mtime_ns
    agent = load_agent(ws, "a")
    assert (agent.settings.model, agent.persona.strip()) == ("two", "Persona B.")


def test_what_a_caller_changes_in_a_read_never_reaches_the_next_read(tmp_path: Path) -> None:
    md = write(tmp_path, {"x.md": "---\ntools: [read]\nnested: {k: [1, 2]}\n---\nbody\n"}) / "x.md"
    first = frontmatter.read_front(md, "x.md")
    first.data["tools"].append("write")
    first.data["nested"]["k"].clear()
    first.lines.clear()
    again = frontmatter.read_front(md, "x.md")
    assert again.data == {"tools": ["read"], "nested": {"k": [1, 2]}}
    assert again.lines["tools"] == 2 and again.body.strip() == "body"


def test_a_file_that_does_not_parse_is_refused_on_every_read(tmp_path: Path) -> None:
    md = write(tmp_path, {"x.md": "---\na: [1\n---\n"}) / "x.md"
    for _ in range(2):
        with pytest.raises(WorkspaceInvalid):
            frontmatter.read_front(md, "x.md")


def test_the_parses_kept_are_bounded(tmp_path: Path) -> None:
    for i in range(frontmatter.PARSED_KEPT + 20):
        md = write(tmp_path, {f"f{i}.md": f"---\nn: {i}\n---\n"}) / f"f{i}.md"
        assert frontmatter.read_front(md, f"f{i}.md").data == {"n": i}
    assert len(frontmatter._parsed) <= frontmatter.PARSED_KEPT


# --------------------------------------------------------------------------- revision


def test_revision_is_stable_and_changes_when_a_workspace_file_changes(tmp_path: Path) -> None:
    ws_root = tmp_path / "ws"
    shutil.copytree(WS_OK, ws_root)
    first = workspace_revision(ws_root)
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64
    assert workspace_revision(ws_root) == first

    # What runs write, and hidden files, do not count.
    write(
        ws_root,
        {
            "agents/writer/outputs/draft.md": "draft",
            "storage/brief.pdf": b"%PDF",
            ".git/HEAD": "ref",
            "flows/__pycache__/x.pyc": b"\0",
            ".DS_Store": b"\0",
        },
    )
    assert workspace_revision(ws_root) == first

    (ws_root / "knowledge/style.md").write_text("House style: long sentences.\n")
    changed = workspace_revision(ws_root)
    assert changed != first

    # A renamed file with the same bytes is a different workspace.
    (ws_root / "knowledge/style.md").rename(ws_root / "knowledge/style2.md")
    assert workspace_revision(ws_root) not in (first, changed)
