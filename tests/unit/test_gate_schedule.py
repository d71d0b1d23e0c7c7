"""A tiny discrete model of a gated lane, run on the real plan (`plan_lanes`) and the real
reserve rule (`is_reserve`): the lead in its own Map, the siblings in a Map of
`sibling_parallel` workers that take iterations in index order (as moto's interpreter and
Step Functions do), each sibling starting once its gate lets it (the lead's reply for most,
the lead's end for the reserve). It shows the makespan against the ideal for the cap, and
that the cap is never passed, before any engine runs."""

from __future__ import annotations

import heapq
import math
from typing import Any

import pytest

from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.gate import is_reserve
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.records import Step


def lane_of(n: int, parallel: int) -> Any:
    flow = Flow(
        name="f", path="flows/f.yaml", entries=[Entry(index=0, kind="steps", steps=[StepSpec(agent="a", parallel=parallel)])]
    )
    steps = [Step(index=i, group=0, entry=0, slot=0, agent="a", model="stub") for i in range(n)]
    [lane] = plan_lanes(steps, flow, 100, gate=True)
    return lane


def schedule(n: int, parallel: int, d: float, ttft: float, *, reserve: bool = True, sibling_parallel: int | None = None) -> Any:
    """(start, end) of every step: the lead first, then its siblings."""
    lane = lane_of(n, parallel)
    cap = sibling_parallel if sibling_parallel is not None else lane.sibling_parallel
    spans = [(0.0, d)]  # the lead: starts at once, its reply begins at ttft, it ends at d
    workers = [0.0] * cap
    heapq.heapify(workers)
    for map_index, _ in enumerate(lane.siblings):
        arrives = heapq.heappop(workers)  # the Map starts the next iteration as a worker frees
        opens = d if reserve and is_reserve(map_index, lane.parallel) else ttft
        start = max(arrives, opens)
        spans.append((start, start + d))
        heapq.heappush(workers, start + d)
    return spans


def most_at_once(spans: Any) -> int:
    return max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)


def makespan(spans: Any) -> float:
    answer: float = max(b for _, b in spans) - min(a for a, _ in spans)
    return answer


def test_twelve_steps_of_two_seconds_at_parallel_three_take_about_the_ideal() -> None:
    spans = schedule(12, 3, d=2.0, ttft=0.4)
    ideal = math.ceil(12 / 3) * 2.0
    assert makespan(spans) == pytest.approx(8.4)
    assert makespan(spans) <= ideal * 1.10
    assert most_at_once(spans) == 3


@pytest.mark.parametrize("parallel", [2, 3, 5])
def test_the_plan_runs_the_siblings_at_the_full_cap_and_one_of_them_holds_the_lead_s_slot(parallel: int) -> None:
    # The plan's own numbers, not the model's: the siblings' Map runs `parallel` at a time, and
    # exactly one of its first `parallel` iterations (the reserve) waits for the lead's end.
    lane = lane_of(12, parallel)
    assert lane.sibling_parallel == parallel
    assert [i for i in range(len(lane.siblings)) if is_reserve(i, lane.parallel)] == [parallel - 1]
    assert not is_reserve(0, 1) and not is_reserve(None, parallel) and not is_reserve(parallel - 1, None)


def test_without_the_reserve_a_full_siblings_map_would_pass_the_cap() -> None:
    spans = schedule(12, 3, d=2.0, ttft=0.4, reserve=False)
    assert most_at_once(spans) == 4


@pytest.mark.parametrize("parallel", [2, 3, 4, 8])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 9, 12, 33])
@pytest.mark.parametrize("ttft", [0.0, 0.4, 1.9])
def test_the_cap_is_never_passed_and_the_lane_loses_at_most_the_lead_s_time_to_first_token(
    n: int, parallel: int, ttft: float
) -> None:
    spans = schedule(n, parallel, d=2.0, ttft=ttft)
    cap = min(parallel, n)
    assert most_at_once(spans) <= cap
    assert makespan(spans) <= math.ceil(n / cap) * 2.0 + ttft + 1e-9
