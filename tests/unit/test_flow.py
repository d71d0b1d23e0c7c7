"""Flows: parsing, validation that lists every problem with its line, schema files, run
input checks, and `check_workspace`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from laneflow.domain.errors import FlowInvalid, RunInputInvalid, WorkspaceInvalid
from laneflow.domain.flow import Flow, check_workspace, load_flow, validate_input
from laneflow.domain.workspace import Workspace, load_workspace

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WS_OK = FIXTURES / "ws_ok"
WS_BROKEN = FIXTURES / "ws_broken"

AGENTS = ("writer", "checker", "rescuer")


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def flow_ws(tmp_path: Path, flow: str, **files: str) -> Any:
    """A workspace with agents writer, checker and rescuer, and `flows/f.yaml`."""
    root = tmp_path / "ws"
    write(root, {"AGENTS.md": "", "flows/f.yaml": flow, **files})
    for agent in AGENTS:
        write(root, {f"agents/{agent}/agent.md": f"You are the {agent}."})
    return load_workspace(root)


def problems_of(ws: Workspace, name: str = "f") -> Any:
    with pytest.raises(FlowInvalid) as e:
        load_flow(ws, name)
    return e.value.problems


def only_problem(ws: Workspace, name: str = "f") -> Any:
    [problem] = problems_of(ws, name)
    return problem


# --------------------------------------------------------------------------- valid flows


def test_design_example_flow_loads_with_every_shape() -> None:
    flow = load_flow(load_workspace(WS_OK), "brief")

    assert (flow.name, flow.path, flow.budget) == ("brief", "flows/brief.yaml", 1.5)
    assert flow.input_schema == {"type": "object", "required": ["topics"]}
    assert [e.kind for e in flow.entries] == ["steps", "steps", "steps", "approval", "steps"]
    assert [e.index for e in flow.entries] == [0, 1, 2, 3, 4]
    assert [e.line for e in flow.entries] == [8, 12, 15, 20, 21]

    research = flow.entries[0].steps[0]
    assert (research.agent, research.each, research.each_input, research.parallel) == ("researcher", "input.topics", "topics", 4)
    assert (research.retries, research.handoff, research.output) == (1, "results", "text")
    assert flow.entries[1].steps[0].on_fail == "rescuer"

    checker = flow.entries[2].steps[0]
    assert (checker.until, checker.loop, checker.max_cycles) == ("APPROVED", "writer", 3)
    assert flow.entries[3].approval == "Publish this brief?"

    publisher, notifier = flow.entries[4].steps
    assert publisher.output == "json"
    assert publisher.schema_ref == "schemas/post.json"
    assert publisher.schema_ is not None and publisher.schema_["required"] == ["title", "body"]  # resolved from the file
    assert publisher.verify_judge == "Is the post faithful to the brief?"
    assert notifier.optional is True and notifier.instruction == ""


def test_flow_survives_the_round_trip_a_run_record_makes() -> None:
    # A run keeps the flow as JSON (by alias: `schema`) and reads it back on every drive.
    flow = load_flow(load_workspace(WS_OK), "brief")
    stored = flow.model_dump(mode="json", by_alias=True)
    assert "schema" in stored["entries"][4]["steps"][0]
    assert Flow.model_validate(stored) == flow


def test_inline_each_list_and_inline_schema() -> None:
    [entry] = load_flow(load_workspace(WS_OK), "inline").entries
    [step] = entry.steps
    assert step.each == ["a", "b"] and step.each_input is None
    assert step.schema_ == {"type": "object", "required": ["title"]} and step.schema_ref is None
    assert (step.handoff, step.retries, step.model) == ("data", 0, "stub")


def test_until_without_max_cycles_defaults_to_three_and_loop_may_name_its_own_group(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        """
steps:
  - group:
      - agent: writer
      - agent: checker
        until: OK
        loop: writer
""",
    )
    checker = load_flow(ws, "f").entries[0].steps[1]
    assert (checker.loop, checker.max_cycles) == ("writer", 3)


def test_each_given_as_a_json_list_string_is_read_as_the_list(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, 'steps:\n  - agent: writer\n    each: \'["x", "y"]\'\n')
    assert load_flow(ws, "f").entries[0].steps[0].each == ["x", "y"]


# --------------------------------------------------------------------------- problems


def test_broken_flow_reports_every_mistake_with_its_line() -> None:
    problems = problems_of(load_workspace(WS_BROKEN), "messy")
    found = {(p.file, p.line, p.field) for p in problems}

    assert found == {
        ("flows/messy.yaml", 6, "steps[0].agnet"),  # typo
        ("flows/messy.yaml", 8, "steps[1].agent"),  # unknown agent
        ("flows/messy.yaml", 9, "steps[1].each"),  # input the schema does not declare
        ("flows/messy.yaml", 12, "steps[2].loop"),  # loop to a later agent
        ("flows/messy.yaml", 13, "steps[2].max_cycles"),  # past the cycle limit
        ("schemas/bad.json", 2, None),  # schema file that is not JSON
        ("flows/messy.yaml", 18, "steps[4].schema"),  # missing file, and not output: json
        ("flows/messy.yaml", 19, "steps[5]"),  # approval with other keys
    }
    assert len(problems) == 9
    text = "\n".join(map(str, problems))
    for expected in (
        "unknown key 'agnet' (did you mean 'agent'?)",
        "unknown agent 'ghost'",
        "input.subjects is not in the flow's input schema",
        "loop goes back to 'writer'",
        "max_cycles is a whole number from 1 to 20",
        "schema file is not valid JSON",
        "schema file schemas/missing.json not found",
        "schema applies only with output: json",
        "approval: stands alone",
    ):
        assert expected in text


def test_unknown_key_suggests_the_closest_known_key(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "steps:\n  - agent: writer\n    instrucion: Write.\n")
    problem = only_problem(ws)
    assert (problem.line, problem.field) == (3, "steps[0].instrucion")
    assert problem.message == "unknown key 'instrucion' (did you mean 'instruction'?)"


def test_unknown_top_level_key_suggests_too(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "step:\n  - agent: writer\n")
    problem = only_problem(ws)  # not also "no steps:": the typo is the one mistake
    assert problem.message == "unknown key 'step' (did you mean 'steps'?)"


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "steps:\n  - agent: writer\n    instruction: [unclosed\n  - agent: checker\n")
    problem = only_problem(ws)
    assert problem.file == "flows/f.yaml"
    assert problem.line == 4
    assert "YAML does not parse" in problem.message


@pytest.mark.parametrize(
    "flow, line, field, message",
    [
        ("steps: []\n", 1, "steps", "steps is empty"),
        ("steps:\n  - agent: checker\n    until: OK\n", 3, "steps[0].until", "until needs loop:"),
        ("steps:\n  - agent: writer\n  - agent: checker\n    loop: writer\n", 4, "steps[1].loop", "loop needs until:"),
        ("steps:\n  - agent: writer\n    max_cycles: 2\n", 3, "steps[0].max_cycles", "applies only to a loop"),
        (
            "steps:\n  - agent: writer\n  - agent: checker\n    until: OK\n    loop: writer\n    max_cycles: 0\n",
            6,
            "steps[1].max_cycles",
            "from 1 to 20",
        ),
        ("steps:\n  - agent: writer\n    each: topics\n", 3, "steps[0].each", "input.NAME or a list"),
        ("steps:\n  - agent: writer\n    each: []\n", 3, "steps[0].each", "empty list"),
        ("steps:\n  - agent: writer\n    on_fail: nobody\n", 3, "steps[0].on_fail", "unknown agent 'nobody'"),
        ("steps:\n  - agent: writer\n    parallel: 0\n", 3, "steps[0].parallel", "at least 1"),
        ("steps:\n  - agent: writer\n    retries: -1\n", 3, "steps[0].retries", "at least 0"),
        ("steps:\n  - agent: writer\n    optional: maybe\n", 3, "steps[0].optional", "true or false"),
        ("steps:\n  - agent: writer\n    handoff: everything\n", 3, "steps[0].handoff", "results, conclusions"),
        ("steps:\n  - agent: writer\n    output: xml\n", 3, "steps[0].output", "'text' or 'json'"),
        ("steps:\n  - agent: writer\n    verify:\n      jduge: ok?\n", 4, "steps[0].verify.jduge", "did you mean 'judge'?"),
        ("steps:\n  - group: []\n", 2, "steps[0].group", "group is empty"),
        ("steps:\n  - group:\n      - writer\n", 3, "steps[0].group[0]", "a group holds steps"),
        ("steps:\n  - group:\n      - approval: ok?\n", 3, "steps[0].group[0]", "steps only"),
        ("steps:\n  - instruction: Write.\n", 2, "steps[0].agent", "a step needs 'agent:'"),
        ("steps:\n  - agent: writer\n    agent: checker\n", 3, "steps[0].agent", "given twice"),
        ("budget: 0\nsteps:\n  - agent: writer\n", 1, "budget", "greater than 0"),
        ("input: {type: objekt}\nsteps:\n  - agent: writer\n", 1, "input.type", "not a valid JSON Schema"),
        (
            "input:\n  properties: {n: {type: string}}\nsteps:\n  - agent: writer\n    each: input.n\n",
            5,
            "steps[0].each",
            "declared as 'string', not a list",
        ),
        (
            "steps:\n  - agent: writer\n    output: json\n    schema: {type: 12}\n",
            4,
            "steps[0].schema",
            "not a valid JSON Schema",
        ),
    ],
)
def test_each_kind_of_mistake_is_reported_with_line_and_field(
    tmp_path: Path, flow: str, line: int, field: str, message: str
) -> None:
    problem = only_problem(flow_ws(tmp_path, flow))
    assert (problem.file, problem.line, problem.field) == ("flows/f.yaml", line, field)
    assert message in problem.message


def test_loop_to_an_agent_that_only_runs_later_is_refused(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        """
steps:
  - agent: checker
    until: OK
    loop: writer
  - agent: writer
""",
    )
    problem = only_problem(ws)
    assert (problem.line, problem.field) == (5, "steps[0].loop")
    assert "not a step of this or an earlier entry" in problem.message


# --------------------------------------------------------------------------- schema files


def test_schema_path_is_resolved_relative_to_the_workspace(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        "steps:\n  - agent: writer\n    output: json\n    schema: schemas/out.json\n",
        **{"schemas/out.json": '{"type": "object", "required": ["x"]}'},
    )
    step = load_flow(ws, "f").entries[0].steps[0]
    assert step.schema_ref == "schemas/out.json"
    assert step.schema_ == {"type": "object", "required": ["x"]}


def test_schema_file_that_is_not_a_json_schema_names_the_schema_file(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        "steps:\n  - agent: writer\n    output: json\n    schema: schemas/out.json\n",
        **{"schemas/out.json": '{"type": "object", "properties": {"x": {"type": 5}}}'},
    )
    problem = only_problem(ws)
    assert problem.file == "schemas/out.json"
    assert problem.field == "$.properties.x.type"
    assert "not a valid JSON Schema" in problem.message and "steps[0]" in problem.message


def test_schema_path_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "steps:\n  - agent: writer\n    output: json\n    schema: ../secret.json\n")
    assert "inside the workspace" in only_problem(ws).message


def test_a_schema_file_used_twice_is_reported_once(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        "steps:\n  - agent: writer\n    output: json\n    schema: s.json\n"
        "  - agent: checker\n    output: json\n    schema: s.json\n",
        **{"s.json": "{not json"},
    )
    assert [p.file for p in problems_of(ws)] == ["s.json"]


def test_unknown_flow_is_refused(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "steps:\n  - agent: writer\n")
    with pytest.raises(FlowInvalid, match=r"no flow 'nope' in \S+ \(flows/nope.yaml not found\)"):
        load_flow(ws, "nope")


# --------------------------------------------------------------------------- run input


def brief() -> Any:
    return load_flow(load_workspace(WS_OK), "brief")


def test_valid_input_passes() -> None:
    validate_input(brief(), {"topics": ["tides", "moons"]})


def test_input_errors_name_each_field_by_its_json_path(tmp_path: Path) -> None:
    ws = flow_ws(
        tmp_path,
        """
input:
  type: object
  required: [topics, tone]
  properties:
    topics: {type: array, items: {type: string}}
    tone: {type: string}
    words: {type: integer}
steps:
  - agent: writer
    each: input.topics
""",
    )
    with pytest.raises(RunInputInvalid) as e:
        validate_input(load_flow(ws, "f"), {"topics": ["a", 3], "words": "many"})
    by_field = {p.field: p.message for p in e.value.problems}
    assert "'tone' is a required property" in by_field["$"]
    assert "is not of type 'string'" in by_field["$.topics[1]"]
    assert "is not of type 'integer'" in by_field["$.words"]
    assert all(p.file == "input" for p in e.value.problems)


def test_each_on_a_missing_or_non_list_input_is_an_input_error(tmp_path: Path) -> None:
    ws = flow_ws(tmp_path, "steps:\n  - agent: writer\n    each: input.items\n")  # no schema
    flow = load_flow(ws, "f")
    with pytest.raises(RunInputInvalid) as e:
        validate_input(flow, {})
    assert e.value.problems[0].field == "$.items" and "missing" in e.value.problems[0].message
    with pytest.raises(RunInputInvalid, match="must be a list"):
        validate_input(flow, {"items": "one"})


# --------------------------------------------------------------------------- check


def test_check_workspace_on_the_ok_fixture_finds_nothing() -> None:
    assert check_workspace(WS_OK) == []


def test_check_workspace_lists_the_malformed_agent_md_and_every_flow_mistake() -> None:
    problems = check_workspace(WS_BROKEN)

    broken = [p for p in problems if p.file == "agents/broken/agent.md"]
    assert len(broken) == 1 and broken[0].line == 4
    flow_fields = {p.field for p in problems if p.file == "flows/messy.yaml"}
    assert flow_fields == {
        "steps[0].agnet",
        "steps[1].agent",
        "steps[1].each",
        "steps[2].loop",
        "steps[2].max_cycles",
        "steps[4].schema",
        "steps[5]",
    }
    assert any(p.file == "schemas/bad.json" for p in problems)
    assert all(not Path(p.file).is_absolute() for p in problems)


def test_check_workspace_collects_warnings_and_agents_md_errors_without_raising(tmp_path: Path) -> None:
    root = write(
        tmp_path / "ws",
        {
            "AGENTS.md": "---\nbudget: free\n---\n",
            "agents/a/agent.md": "---\ndescription: Use when: asked\n---\n",
            "agents/empty/notes.txt": "",
        },
    )
    problems = check_workspace(root)
    assert [(p.file, p.severity) for p in problems] == [
        ("AGENTS.md", "error"),
        ("agents/empty", "warning"),
        ("agents/a/agent.md", "warning"),
    ]


def test_check_workspace_still_raises_for_a_missing_workspace(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceInvalid):
        check_workspace(tmp_path / "missing")
