"""The flow models carry their own constraints, and the checker words each refusal from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import FIXTURES

from laneflow.domain.errors import FlowInvalid
from laneflow.domain.flow import STEP_KEYS, TOP_KEYS, Flow, StepSpec, load_flow
from laneflow.domain.flow_check import says
from laneflow.domain.workspace import load_workspace


def test_every_key_a_step_or_a_flow_takes_says_in_words_what_it_is() -> None:
    checked_by_the_checker = {"verify", "steps"}  # a nested mapping, the list of entries
    for key in STEP_KEYS:
        if key not in checked_by_the_checker:
            assert says(StepSpec, key).text.startswith(f"{key} is"), key
    fields = {"input": "input_schema"}
    for key in TOP_KEYS:
        if key not in checked_by_the_checker:
            assert not says(Flow, fields.get(key, key)).text.endswith("is not valid"), key


def test_a_refusal_is_worded_from_the_field_and_names_the_value(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "agents" / "writer").mkdir(parents=True)
    (root / "agents" / "writer" / "agent.md").write_text("You write.")
    (root / "flows").mkdir()
    (root / "flows" / "f.yaml").write_text("steps:\n  - {agent: writer, parallel: 0, retries: 1.5, max_cycles: 30}\n")
    with pytest.raises(FlowInvalid) as e:
        load_flow(load_workspace(root), "f")
    # Three problems on one line, in the order a step's keys are reported.
    assert [(p.line, p.field, p.message) for p in e.value.problems] == [
        (2, "steps[0].parallel", "parallel is a whole number of at least 1, got 0"),
        (2, "steps[0].retries", "retries is a whole number of at least 0, got 1.5"),
        (2, "steps[0].max_cycles", "max_cycles is a whole number from 1 to 20, got 30"),
    ]


def test_a_flow_the_store_kept_is_read_without_its_workspace() -> None:
    # Validated without the as-written context: agent names are not looked up, the bounds hold.
    flow = load_flow(load_workspace(FIXTURES / "ws_ok"), "brief")
    kept = Flow.model_validate(flow.model_dump(mode="json"))
    assert kept == flow
    with pytest.raises(ValueError):
        StepSpec.model_validate({"agent": "anyone", "parallel": 0})
    assert StepSpec.model_validate({"agent": "anyone"}).agent == "anyone"
