"""agent.md, AGENTS.md and flow files, given anything YAML-ish: they load (and what loaded
can be kept as JSON), or the library's problem error names the file; never another
exception. `laneflow check` collects the same without raising."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain import jsonsafe
from laneflow.domain.errors import FlowInvalid, WorkspaceInvalid
from laneflow.domain.flow import check_workspace, load_flow
from laneflow.domain.frontmatter import read_front
from laneflow.domain.workspace import load_agent, load_workspace

AGENT_KEYS = [
    "model",
    "effort",
    "tools",
    "budget",
    "timeout",
    "max_turns",
    "sandbox",
    "size",
    "secrets",
    "apis",
    "stub",
    "description",
]
STEP_KEYS = [
    "agent",
    "instruction",
    "each",
    "parallel",
    "retries",
    "on_fail",
    "until",
    "loop",
    "max_cycles",
    "output",
    "schema",
    "optional",
    "handoff",
    "model",
    "verify",
]

SCALARS = st.one_of(
    st.sampled_from(
        [
            "stub",
            "writer",
            "0",
            "-1",
            "1.5",
            ".inf",
            "-.inf",
            ".nan",
            "1e999",
            "1.0e+999",
            "0x" + "f" * 300,
            "9" * 5000,
            "~",
            "null",
            "true",
            "no",
            "2024-01-01",
            '"\\ud800"',
            '"\\udfff x"',
            "'quoted: colon'",
            "a: b",
            "*undefined",
            "&x 1",
            "!!binary aGk=",
            "!!python/object:os.system",
            "[",
            "]",
            "{",
            "|",
            ">-",
            "'",
            '"',
            "@x",
            "`x`",
            "%x",
            "[[[[[[[[[[]]]]]]]]]]",
            "[" * 200 + "]" * 200,
            "{a: {b: {c: .nan}}}",
            "[1, .inf]",
            "'cost: inf'",
            '"delay_ms: 99999999999\\nx"',
            "'cost: {input.c}'",
            "json",
            "text",
            "results",
            # values PyYAML resolves but cannot build (a ValueError or OverflowError, not a YAML error)
            "2001-13-45",
            "2001-02-30",
            "0000-01-01",
            "2001-12-14t21:59:43.10+99:00",
            "9999-12-31 23:59:60",
            "1" + ":59" * 200 + ".5",
            "!!timestamp x",
            "!!int x",
            "!!float x",
            "!!bool x",
            "!!set x",
            "!!omap x",
            "!foo bar",
            "!!binary x",
            "{1: a, true: b}",
            "{a: 1, a: 2}",
            "[2001-13-45]",
        ]
    ),
    st.text(max_size=10),
)
KEYS = st.one_of(
    st.sampled_from(["5", "~", "true", "? a", "[k]", "<<", "'q'", "1.5", "null", "2001-13-45", "!!int k"]), st.text(max_size=6)
)


@st.composite
def mapping_lines(draw: st.DrawFn, keys: list[str], indent: str = "") -> str:
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(st.sampled_from(keys) | KEYS)
        kind = draw(st.integers(0, 3))
        if kind == 0:
            lines.append(f"{indent}{key}: {draw(SCALARS)}")
        elif kind == 1:
            lines.append(f"{indent}{key}:")
            lines += [f"{indent}  - {draw(SCALARS)}" for _ in range(draw(st.integers(0, 3)))]
        elif kind == 2:
            lines.append(f"{indent}{key}: |")
            lines += [f"{indent}  {draw(SCALARS)}" for _ in range(draw(st.integers(0, 3)))]
        else:
            lines.append(draw(st.text(max_size=20)))
    return "\n".join(lines)


@st.composite
def agent_md(draw: st.DrawFn) -> str:
    return f"---\n{draw(mapping_lines(AGENT_KEYS))}\n---\n{draw(st.text(max_size=20))}"


@st.composite
def flow_yaml(draw: st.DrawFn) -> str:
    top = draw(mapping_lines(["description", "budget", "input"]))
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        body = draw(mapping_lines(STEP_KEYS, indent="    "))
        steps.append("  - agent: writer\n" + body if draw(st.booleans()) else "  - " + body.lstrip())
    return top + "\nsteps:\n" + "\n".join(steps) if draw(st.booleans()) else top + "\n" + "\n".join(steps)


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="fm-fuzz-")) / "ws"
    (root / "agents" / "writer").mkdir(parents=True)
    (root / "agents" / "writer" / "agent.md").write_text("You write.")
    (root / "agents" / "a").mkdir()
    (root / "flows").mkdir()
    (root / "schemas").mkdir()
    (root / "schemas" / "x.json").write_text('{"type": "object"}')
    (root / "AGENTS.md").write_text("")
    yield root
    shutil.rmtree(root.parent)


def write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))


def loads_or_names_the_file(root: Path, rel: str, load: Callable[[], object]) -> None:
    try:
        loaded = load()
    except (WorkspaceInvalid, FlowInvalid) as refused:
        assert refused.problems or rel in str(refused), str(refused)
        assert all(p.file == rel or p.file.startswith("schemas/") for p in refused.problems), refused.problems
        return
    # What loaded can be kept: a run records it as JSON.
    assert jsonsafe.refusal(loaded.model_dump(mode="json", by_alias=True, exclude={"root", "account_root"})) is None  # type: ignore[attr-defined]


@given(st.one_of(agent_md(), st.text(max_size=80)))
def test_agent_md_frontmatter_loads_or_is_a_problem_naming_the_file(workspace: Path, text: Any) -> None:
    write(workspace / "agents" / "a" / "agent.md", text)
    loads_or_names_the_file(workspace, "agents/a/agent.md", lambda: load_agent(load_workspace(workspace), "a"))
    check_workspace(workspace)  # collects; never raises for a file's problem


@pytest.mark.slow
@given(st.one_of(agent_md(), st.text(max_size=80)))
def test_agents_md_frontmatter_loads_or_is_a_problem_naming_the_file(workspace: Path, text: Any) -> None:
    write(workspace / "AGENTS.md", text)
    try:
        loads_or_names_the_file(workspace, "AGENTS.md", lambda: load_workspace(workspace))
        check_workspace(workspace)
    finally:
        write(workspace / "AGENTS.md", "")


@pytest.mark.slow
@given(st.one_of(flow_yaml(), st.text(max_size=80)))
def test_a_flow_loads_or_is_a_problem_naming_the_flow_file(workspace: Path, text: Any) -> None:
    write(workspace / "flows" / "f.yaml", text)
    loads_or_names_the_file(workspace, "flows/f.yaml", lambda: load_flow(load_workspace(workspace), "f"))
    check_workspace(workspace)


@given(st.one_of(agent_md(), st.text(max_size=80)))
def test_the_frontmatter_reader_raises_nothing_but_workspace_invalid(tmp_path_factory: pytest.TempPathFactory, text: Any) -> None:
    """`read_front` itself, on any text: a Front, or the library's own error naming the file
    (with the line and field of each value that could not be taken); never another."""
    path = tmp_path_factory.mktemp("fm") / "x.md"
    write(path, text)
    try:
        front = read_front(path, "x.md")
    except WorkspaceInvalid as refused:
        assert refused.problems and all(p.file == "x.md" for p in refused.problems), str(refused)
        return
    assert all(p.file == "x.md" and p.line and p.field is not None for p in front.errors), front.errors
    assert not any(key in front.data for p in front.errors for key in [(p.field or "").split(".")[0].split("[")[0]])


@given(
    st.integers(0, 10_000),
    st.integers(0, 99),
    st.integers(0, 99),
    st.sampled_from(["", "t12:00:00", " 25:61:61", "t1:2:3+30:00"]),
)
def test_a_date_in_frontmatter_is_taken_or_is_a_problem_with_its_line_and_field(
    workspace: Path, year: int, month: int, day: int, time: str
) -> None:
    """`seen: YYYY-MM-DD`: a date that is one is an unknown setting (a warning); one that is
    not is an error naming the file, the line and the field, never an exception."""
    text = f"---\nmodel: stub\nseen: {year:04d}-{month:02d}-{day:02d}{time}\n---\nYou see."
    write(workspace / "agents" / "a" / "agent.md", text)
    try:
        agent = load_agent(load_workspace(workspace), "a")
    except WorkspaceInvalid as refused:
        assert [str(p).split(": ")[0:2] for p in refused.problems] == [["agents/a/agent.md:3", "seen"]], str(refused)
        return
    assert [p.field for p in agent.warnings] == ["seen"]


@given(st.lists(st.sampled_from(["model", "timeout", "budget", "5", "0x5", "'model'"]), min_size=1, max_size=5))
def test_a_setting_given_twice_in_frontmatter_is_an_error_naming_it(workspace: Path, keys: list[str]) -> None:
    """Keys as YAML reads them (`5` and `0x5` are one number, `'model'` is `model`): a
    repeat is an error on the second one's line, never the last one silently taken."""
    lines = [f"{key}: 1" for key in keys]
    write(workspace / "agents" / "a" / "agent.md", "---\n" + "\n".join(lines) + "\n---\nYou.")
    read_as = [{"0x5": 5, "5": 5, "'model'": "model"}.get(k, k) for k in keys]
    repeats = [i for i, k in enumerate(read_as) if k in read_as[:i]]
    try:
        load_agent(load_workspace(workspace), "a")
    except WorkspaceInvalid as refused:
        said = {p.line for p in refused.problems if "is given twice" in p.message}
        assert said == {i + 2 for i in repeats}, str(refused)
        return
    assert not repeats
