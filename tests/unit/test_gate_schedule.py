"""The plan of a gated lane (`plan_lanes`) and the real reserve rule (`is_reserve`): the
siblings' Map runs at the lane's full cap, and exactly one of its first `parallel`
iterations (the reserve) holds the lead's slot. What the engine then does with that plan (the
cap never passed, the reserve starting after the lead's end) is tests/integration/test_gate_cap.py."""

from __future__ import annotations

import pytest

from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.gate import is_reserve
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.messages import Lane
from laneflow.domain.records import Step


def lane_of(n: int, parallel: int) -> Lane:
    flow = Flow(
        name="f", path="flows/f.yaml", entries=[Entry(index=0, kind="steps", steps=[StepSpec(agent="a", parallel=parallel)])]
    )
    steps = [Step(index=i, group=0, entry=0, slot=0, agent="a", model="stub") for i in range(n)]
    [lane] = plan_lanes(steps, flow, 100, gate=True)
    return lane


@pytest.mark.parametrize("parallel", [2, 3, 5])
def test_the_plan_runs_the_siblings_at_the_full_cap_and_one_of_them_holds_the_lead_s_slot(parallel: int) -> None:
    # The siblings' Map runs `parallel` at a time, and exactly one of its first `parallel`
    # iterations (the reserve) waits for the lead's end.
    lane = lane_of(12, parallel)
    assert lane.sibling_parallel == parallel
    assert [i for i in range(len(lane.siblings)) if is_reserve(i, lane.parallel)] == [parallel - 1]
    assert not is_reserve(0, 1) and not is_reserve(None, parallel) and not is_reserve(parallel - 1, None)
