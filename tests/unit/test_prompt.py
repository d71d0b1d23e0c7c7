"""Prompt layers: computed in their fixed order, assembled stable-first, each recorded."""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
from pathlib import Path

from laneflow.domain.prompt import LAYER_ORDER, SystemPrompt, build_system_prompt
from laneflow.domain.workspace import load_agent, load_workspace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOW = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)


def researcher_prompt(root: Path = FIXTURES / "ws_ok", now: dt.datetime = NOW) -> SystemPrompt:
    ws = load_workspace(root)
    return build_system_prompt(ws, load_agent(ws, "researcher"), now=now)


def test_stable_layers_come_before_every_dynamic_layer() -> None:
    prompt = researcher_prompt()
    flags = [layer.dynamic for layer in prompt.layers]
    assert True in flags and False in flags
    assert flags == sorted(flags), "a dynamic layer stands before a stable one"
    assert {layer.name for layer in prompt.layers if layer.dynamic} == {"memory", "state", "clock"}


def test_layers_keep_design_order_within_each_half() -> None:
    prompt = researcher_prompt()
    order = [name for name, _ in LAYER_ORDER]
    for half in (False, True):
        names = [layer.name for layer in prompt.layers if layer.dynamic is half]
        assert names == sorted(names, key=order.index)


def scripted_researcher(tmp_path: Path, tools: str = "[read_file, scripts]") -> Path:
    """ws_ok with the researcher's script executable and granted (`tools:` as given)."""
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    (root / "agents" / "researcher" / "scripts" / "fetch.sh").chmod(0o755)
    md = root / "agents" / "researcher" / "agent.md"
    md.write_text(md.read_text().replace("tools: [read_file]", f"tools: {tools}"))
    return root


def test_the_researcher_gets_every_layer_its_folder_supports(tmp_path: Path) -> None:
    names = {layer.name for layer in researcher_prompt(scripted_researcher(tmp_path)).layers}
    assert {
        "persona",
        "where",
        "agents.md",
        "skills",
        "memory",
        "knowledge",
        "scripts",
        "script-tools",
        "state",
        "clock",
        "rules",
    } <= names


def test_scripts_and_secrets_layers_are_left_out_when_the_step_cannot_run_a_program(tmp_path: Path) -> None:
    ws = load_workspace(scripted_researcher(tmp_path, tools="[read_file]"))
    prompt = build_system_prompt(ws, load_agent(ws, "researcher"), secrets=["SEARCH_API_KEY"], now=NOW)
    names = {layer.name for layer in prompt.layers}
    assert not names & {"scripts", "script-tools", "secrets"}


def test_the_scripts_layer_names_each_granted_script_tool_and_the_program_layer_says_what_is_kept(tmp_path: Path) -> None:
    ws = load_workspace(scripted_researcher(tmp_path, tools="[bash, script_fetch]"))
    layers = {layer.name: layer.text for layer in build_system_prompt(ws, load_agent(ws, "researcher"), now=NOW).layers}
    assert "agents/researcher/scripts/fetch.sh (tool `script_fetch`)" in layers["scripts"]
    assert "bash" in layers["script-tools"] and "outputs/" in layers["script-tools"] and "30,000" in layers["script-tools"]


def test_each_layer_records_name_size_hash_prefix_and_dynamic() -> None:
    prompt = researcher_prompt()
    for layer, record in zip(prompt.layers, prompt.records(), strict=True):
        assert record.name == layer.name and record.chars == len(layer.text)
        assert record.sha256 == hashlib.sha256(layer.text.encode()).hexdigest()[:12]
        assert record.dynamic == layer.dynamic


def test_skills_are_one_line_each_from_both_layouts() -> None:
    skills = next(layer for layer in researcher_prompt().layers if layer.name == "skills").text
    lines = [line for line in skills.splitlines() if line.startswith("- ")]
    assert len(lines) == 2 and any("web-search" in line for line in lines) and any("summarize" in line for line in lines)


def test_stable_half_is_unchanged_by_a_new_day_and_new_memory(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    before = researcher_prompt(root)
    (root / "memory" / "feedback.md").write_text("A new lesson learned today.\n")
    after = researcher_prompt(root, now=NOW + dt.timedelta(days=1))
    assert before.stable == after.stable
    changed = {a.name for a, b in zip(before.records(), after.records(), strict=True) if a.sha256 != b.sha256}
    assert changed == {"memory", "clock"}


def test_secrets_layer_names_secrets_but_never_values(tmp_path: Path) -> None:
    ws = load_workspace(scripted_researcher(tmp_path))
    prompt = build_system_prompt(ws, load_agent(ws, "researcher"), secrets=["SEARCH_API_KEY", "@CERT"], now=NOW)
    text = next(layer for layer in prompt.layers if layer.name == "secrets").text
    assert "SEARCH_API_KEY" in text and "environment variable" in text
    assert "CERT" in text and "@CERT" not in text and "path" in text


def test_no_layer_carries_a_local_path() -> None:
    prompt = researcher_prompt()
    root = str((FIXTURES / "ws_ok").resolve())
    assert root not in prompt.stable + prompt.dynamic
    assert "agents/researcher/" in prompt.stable
