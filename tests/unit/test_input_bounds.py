"""Hostile input at each entrance is refused with the file, line and field, never a crash:
strict JSON (`laneflow.jsonsafe`), frontmatter and flow values, stub answer headers, and
schema files that lead out of the workspace."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from laneflow.domain import jsonsafe
from laneflow.domain.errors import FlowInvalid, InvalidInput, StepFailed, WorkspaceInvalid
from laneflow.domain.flow import check_workspace, load_flow
from laneflow.domain.stub_answers import MAX_SIMULATED_MS, BadHeader, parse_answer
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.entrypoints.cli import parse_input
from laneflow.usecases.run_step.output import extract_json


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def agent_problems(tmp_path: Path, agent_md: str) -> Any:
    """The problems loading agent `a` (whose agent.md is `agent_md`) raises."""
    root = write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": agent_md})
    with pytest.raises(WorkspaceInvalid) as err:
        load_agent(load_workspace(root), "a")
    return err.value.problems


def flow_ws(tmp_path: Path, flow: str, **files: str) -> Path:
    """A workspace with agent `writer` and `flows/f.yaml`."""
    return write(tmp_path / "ws", {"AGENTS.md": "", "agents/writer/agent.md": "You write.", "flows/f.yaml": flow, **files})


def problems_of(root: Path) -> Any:
    with pytest.raises(FlowInvalid) as err:
        load_flow(load_workspace(root), "f")
    return err.value.problems


def flow_problems(tmp_path: Path, flow: str, **files: str) -> Any:
    return problems_of(flow_ws(tmp_path, flow, **files))


# -- strict JSON ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, field, words",
    [
        ('{"a": NaN}', "$.a", "NaN"),
        ('{"a": [1, Infinity]}', "$.a[1]", "Infinity"),
        ('{"a": -Infinity}', "$.a", "-Infinity"),
        ('{"a": 1e999}', "$.a", "infinite"),
        ('{"a": "\\ud800"}', "$.a", "lone surrogate"),
        ('{"\\udc00": 1}', "$", "lone surrogate"),
        ('{"a": ' + "9" * 5000 + "}", "$.a", "5000 digits"),
    ],
)
def test_nan_infinity_surrogates_and_huge_numbers_in_run_input_are_refused_naming_the_field(
    text: Any, field: str, words: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_input(text)

    assert err.value.problems[0].field == field
    assert str(err.value).startswith(f"--input: {field}: ") and words in str(err.value)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 3000 + "1" + "}" * 3000, "[" * 65 + "]" * 65])
def test_nesting_past_the_depth_bound_is_refused_naming_input_never_a_recursion_error(text: Any) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_input(text)

    assert str(err.value).startswith("--input: $") and f"deeper than {jsonsafe.MAX_DEPTH} levels" in str(err.value)


def test_input_at_the_depth_bound_and_plain_json_are_accepted() -> None:
    assert parse_input("[" * jsonsafe.MAX_DEPTH + "]" * jsonsafe.MAX_DEPTH) is not None
    assert parse_input('{"a": [1, 2.5, "é", null, true], "b": {"c": -0.0}}') == {"a": [1, 2.5, "é", None, True], "b": {"c": 0.0}}


def test_a_nan_after_a_long_run_of_numbers_is_still_refused() -> None:
    text = "[" + "1.5," * 200_000 + "NaN]"  # within the size bound, yet longer than any estimate of it

    with pytest.raises(InvalidInput) as err:
        parse_input(text)

    assert err.value.problems[0].field == "$[200000]"


def test_input_past_the_size_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = json.dumps({"text": "x" * jsonsafe.MAX_CHARS})
    with pytest.raises(InvalidInput) as err:
        parse_input(big)
    assert "more than" in str(err.value)

    path = tmp_path / "big.json"
    path.write_text(" " * (4 * jsonsafe.MAX_CHARS + 1))
    with pytest.raises(InvalidInput) as err:
        parse_input(f"@{path}")
    assert str(err.value).startswith(f"--input file {path}") and "more than" in str(err.value)


def test_an_input_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b'{"a": "\xff"}')

    with pytest.raises(InvalidInput) as err:
        parse_input(f"@{path}")

    assert str(err.value) == f"--input file {path}: not UTF-8 text (byte 7)"


def test_a_value_that_contains_itself_or_expands_past_the_size_bound_is_refused_without_walking_it_all() -> None:
    loop: list[Any] = []
    loop.append(loop)
    refused = jsonsafe.refusal(loop)
    assert refused is not None and "contains itself" in refused.reason

    laughs: list[Any] = ["lol"] * 10
    for _ in range(40):  # 10**40 strings if walked one by one
        laughs = [laughs] * 10
    found = jsonsafe.refusal({"a": laughs})
    assert found is not None and "more than" in found.reason


# -- frontmatter -------------------------------------------------------------------------------


@pytest.mark.parametrize("key, shown", [("5", "a number (5)"), ("~", "null (~)"), ("true", "true/false (true)")])
def test_a_frontmatter_key_that_is_not_text_is_an_error_naming_file_and_line(tmp_path: Path, key: str, shown: str) -> None:
    problems = agent_problems(tmp_path, f"---\nmodel: stub\n{key}: x\n---\nYou are a.")

    assert [(p.file, p.line) for p in problems] == [("agents/a/agent.md", 3)]
    assert shown in problems[0].message and "must be text" in problems[0].message


@pytest.mark.parametrize(
    "line, words",
    [
        ("budget: " + "9" * 5000, "5000 digits"),
        ("timeout: .inf", "'.inf' is not a finite number"),
        ("budget: .nan", "'.nan' is not a finite number"),
        ('description: "\\ud800"', "lone surrogate"),
        ("tools: " + "[" * 3000 + "]" * 3000, "nested deeper than"),
    ],
)
def test_frontmatter_numbers_and_text_no_setting_can_hold_are_errors_naming_file_and_line(
    tmp_path: Path, line: Any, words: str
) -> None:
    problems = agent_problems(tmp_path, f"---\nmodel: stub\n{line}\n---\nYou are a.")

    assert [(p.file, p.line) for p in problems] == [("agents/a/agent.md", 3)]
    assert words in problems[0].message


def test_laneflow_check_reports_a_frontmatter_crash_as_a_problem(tmp_path: Path) -> None:
    root = write(tmp_path / "ws", {"AGENTS.md": "---\n5: x\n---\n", "agents/a/agent.md": "---\ntimeout: .inf\n---\nA."})

    found = {(p.file, p.line) for p in check_workspace(root) if p.severity == "error"}

    assert found == {("AGENTS.md", 2), ("agents/a/agent.md", 2)}


# -- stub answers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["cost: inf", "cost: nan", "cost: -1", "cost: 1e308", "delay_ms: 99999999999", "ttft_ms: -5", "delay_ms: 1.5"]
)
def test_a_stub_header_value_out_of_bounds_is_refused_naming_the_header(header: str) -> None:
    with pytest.raises(BadHeader) as err:
        parse_answer(f"{header}\nThe reply.")

    assert str(err.value).startswith(header.split(":")[0] + ":")


def test_stub_times_are_bounded_at_ten_minutes() -> None:
    assert parse_answer(f"delay_ms: {MAX_SIMULATED_MS}\nok").delay_ms == MAX_SIMULATED_MS
    with pytest.raises(BadHeader):
        parse_answer(f"delay_ms: {MAX_SIMULATED_MS + 1}\nok")


def test_a_bad_stub_header_is_an_error_of_the_agent_naming_its_agent_md_the_answer_and_the_line(tmp_path: Path) -> None:
    problems = agent_problems(tmp_path, "---\nstub:\n  - fine\n  - |\n    delay_ms: 10\n    cost: inf\n    Reply.\n---\nA.")

    assert [(p.file, p.line, p.field) for p in problems] == [("agents/a/agent.md", 6, "stub[1]")]
    assert "cost: 'inf' is not a price" in problems[0].message


def test_a_stub_header_with_a_placeholder_is_left_for_run_time(tmp_path: Path) -> None:
    root = write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": "---\nstub: 'cost: {input.cost}'\n---\nA."})

    assert load_agent(load_workspace(root), "a").settings.stub == "cost: {input.cost}"


def test_laneflow_check_reports_an_unbounded_delay_in_a_stub_answer(tmp_path: Path) -> None:
    root = write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": "---\nstub: 'delay_ms: 999999999'\n---\nA."})

    problems = [p for p in check_workspace(root) if p.severity == "error"]

    assert [(p.file, p.line, p.field) for p in problems] == [("agents/a/agent.md", 2, "stub")]
    assert "600000" in problems[0].message


# -- flows -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines, line, field, words",
    [
        ("budget: .inf\nsteps:\n  - agent: writer\n", 1, None, "finite"),
        ("steps:\n  - agent: writer\n    each: [a, .nan]\n", 3, None, "finite"),
        ("steps:\n  - agent: writer\n    each: '[1, NaN]'\n", 3, "steps[0].each[1]", "NaN"),
        ("steps:\n  - agent: writer\n    each: [2024-01-01]\n", 3, "steps[0].each[0]", "date"),
        ("steps:\n  - agent: writer\n    each: &a [x, *a]\n", 3, None, "recursive"),
        ("steps:\n  - agent: writer\n    retries: " + "1" * 500 + "\n", 3, None, "500 digits"),
        ('steps:\n  - agent: writer\n    instruction: "\\ud800"\n', 3, None, "lone surrogate"),
        ("input: {properties: {5: {type: string}}}\nsteps:\n  - agent: writer\n", 1, "input.properties", "key must be text"),
        ("steps:\n" + "  - " + "[" * 3000 + "]" * 3000 + "\n", 2, None, "nested deeper"),
    ],
)
def test_flow_values_the_run_could_not_keep_are_refused_naming_file_and_line(
    tmp_path: Path, lines: Any, line: int, field: str | None, words: str
) -> None:
    problems = flow_problems(tmp_path, lines)

    assert any(
        p.file == "flows/f.yaml" and p.line == line and (field is None or p.field == field) and words in p.message
        for p in problems
    ), problems


SCHEMA_FLOW = "steps:\n  - agent: writer\n    output: json\n    schema: schemas/x.json\n"


def test_a_schema_file_that_is_a_symlink_out_of_the_workspace_is_refused_and_never_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("{not json: were it read, this would be the problem")
    root = flow_ws(tmp_path, SCHEMA_FLOW)
    (root / "schemas").mkdir()
    os.symlink(outside, root / "schemas" / "x.json")

    [problem] = problems_of(root)

    assert (problem.file, problem.line, problem.field) == ("flows/f.yaml", 4, "steps[0].schema")
    assert "leads outside the workspace" in problem.message and str(tmp_path) not in problem.message


@pytest.mark.parametrize("ref", ["../outside.json", "schemas/../../outside.json", "/etc/passwd"])
def test_a_schema_path_out_of_the_workspace_is_refused_naming_the_flow_file_and_line(tmp_path: Path, ref: str) -> None:
    (tmp_path / "outside.json").write_text('{"type": "object"}')

    [problem] = flow_problems(tmp_path, SCHEMA_FLOW.replace("schemas/x.json", ref))

    assert (problem.file, problem.line, problem.field) == ("flows/f.yaml", 4, "steps[0].schema")
    assert "inside the workspace" in problem.message


def test_a_schema_file_in_a_symlinked_folder_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.json").write_text('{"type": "object"}')
    root = flow_ws(tmp_path, SCHEMA_FLOW)
    os.symlink(outside, root / "schemas")

    [problem] = problems_of(root)

    assert (problem.file, problem.line) == ("flows/f.yaml", 4) and "outside the workspace" in problem.message


def test_a_schema_file_symlinked_inside_the_workspace_is_read(tmp_path: Path) -> None:
    root = flow_ws(tmp_path, SCHEMA_FLOW, **{"schemas/real.json": '{"type": "object", "required": ["title"]}'})
    os.symlink(root / "schemas" / "real.json", root / "schemas" / "x.json")

    flow = load_flow(load_workspace(root), "f")

    assert flow.entries[0].steps[0].schema_ == {"type": "object", "required": ["title"]}


def test_a_schema_file_holding_nan_is_refused_naming_the_schema_file(tmp_path: Path) -> None:
    problems = flow_problems(tmp_path, SCHEMA_FLOW, **{"schemas/x.json": '{"type": "object", "maximum": NaN}'})

    assert [(p.file, p.field) for p in problems] == [("schemas/x.json", "$.maximum")]
    assert "NaN" in problems[0].message and "flows/f.yaml" in problems[0].message


# -- model output --------------------------------------------------------------------------------


@pytest.mark.parametrize("reply", ['```json\n{"score": NaN}\n```', '{"a": [1, -Infinity]}', '{"a": 1e400}'])
def test_a_model_reply_whose_json_holds_nan_or_infinity_fails_the_attempt_and_is_not_kept(reply: str) -> None:
    with pytest.raises(StepFailed) as err:
        extract_json(reply)

    assert err.value.retryable and "cannot keep" in err.value.reason


def test_a_model_reply_of_plain_json_is_kept() -> None:
    assert extract_json('Done.\n```json\n{"score": 0.5, "tags": ["a"]}\n```') == {"score": 0.5, "tags": ["a"]}
