"""A flow's `then:` given anything YAML can hold: the flow loads, or `FlowInvalid` names the
flow file; never another exception. Filling `then: input:` from any finished run's steps
never raises, and what it gives can be kept as JSON (it becomes a run's input)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain import jsonsafe
from laneflow.domain.chain import fill_then_input
from laneflow.domain.errors import FlowInvalid
from laneflow.domain.flow import load_flow
from laneflow.domain.records import Step, StepStatus
from laneflow.domain.workspace import load_workspace

TEXT = st.one_of(
    st.sampled_from(
        [
            "{result.writer}",
            "{data.writer}",
            "{data.ghost}",
            "{input.topic}",
            "{input.a.b}",
            "x {result.writer} y",
            "{result.}",
            "{result.writer",
            "{{result.writer}}",
            "{data.writer}{data.writer}",
            "publish",
            "publsh",
            "",
        ]
    ),
    st.text(max_size=12),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
THEN = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={"flow": TEXT | JSON, "input": JSON, "flw": JSON, "extra": JSON}),
)


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="then-fuzz-")) / "ws"
    (root / "agents" / "writer").mkdir(parents=True)
    (root / "agents" / "writer" / "agent.md").write_text("You write.")
    (root / "flows").mkdir()
    (root / "flows" / "publish.yaml").write_text("steps:\n  - agent: writer\n")
    (root / "AGENTS.md").write_text("")
    yield root
    shutil.rmtree(root.parent)


@given(THEN)
def test_any_then_loads_or_is_a_problem_naming_the_flow_file(workspace: Path, then: Any) -> None:
    (workspace / "flows" / "f.yaml").write_text(yaml.safe_dump({"steps": [{"agent": "writer"}], "then": then}))
    try:
        flow = load_flow(load_workspace(workspace), "f")
    except FlowInvalid as refused:
        assert refused.problems and all(p.file == "flows/f.yaml" for p in refused.problems), refused.problems
        return
    assert flow.then is not None and flow.then.flow == "publish"
    assert jsonsafe.refusal(flow.model_dump(mode="json", by_alias=True)) is None


STEPS = st.lists(
    st.builds(
        lambda i, agent, status, result, data, rescue: Step(
            index=i, group=0, agent=agent, status=status, result=result, data=data, rescue_of=rescue
        ),
        st.integers(0, 5),
        st.sampled_from(["writer", "scout", None]),
        st.sampled_from(list(StepStatus)),
        st.none() | st.text(max_size=8),
        JSON,
        st.none() | st.integers(0, 3),
    ),
    max_size=5,
)


@given(JSON, JSON, STEPS)
def test_filling_any_then_input_from_any_steps_gives_keepable_json(template: Any, run_input: Any, steps: Any) -> None:
    filled = fill_then_input(template, run_input, steps)
    assert jsonsafe.refusal(filled) is None
