"""Windows: how much of a group one execution runs, so that no execution's history passes
its budget (laneflow.domain.history).

A drive's execution runs at most `budget` history events. NextGroup plans a *window* of the
launching group: its pending steps in index order, as many as fit what is left of the
budget once the execution's own states (its start, its last NextGroup and its end) are
reserved. A group larger than that runs in several windows, each settled as `next` until
the last; when not even one step fits, the drive continues in a fresh execution (NextGroup
answers `continue`). A fresh execution always runs at least one step (or one rescue), so a
budget too small for one step still makes progress.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from laneflow.domain.history import HistoryCosts
from laneflow.domain.messages import Lane, LaneStep
from laneflow.domain.records import Step


def lanes_cost(lanes: list[Lane], costs: HistoryCosts) -> int:
    """The events a planned group's lanes record (their RunGroup iterations and steps)."""
    total = 0
    for lane in lanes:
        total += costs.lane
        # A lead, or a lone step, passes WaitForPrefix first: it costs a lead's path.
        role = "lead" if lane.prefix_wait else "solo"
        total += len(lane.starters) * costs.of_step(role, sandboxed=lane.sandboxed)
        total += len(lane.siblings) * costs.of_step("sibling", sandboxed=lane.sandboxed)
    return total


def window_cost(lanes: list[Lane], costs: HistoryCosts) -> int:
    """One window of a group: NextGroup, Route, RunGroup, SettleGroup, AfterGroup, its lanes."""
    return costs.group + lanes_cost(lanes, costs)


def fits(used: int, more: int, budget: int, costs: HistoryCosts) -> bool:
    """Whether `more` events still fit after `used`, the execution's own end reserved."""
    return used + more + costs.drive <= budget


def most_steps(*, used: int, budget: int, costs: HistoryCosts) -> int:
    """The most steps a window can hold: what the room left pays for at the cheapest step's
    cost (at least one). NextGroup reads no more pending steps than this, and one more."""
    room = budget - costs.drive - used - costs.group - costs.lane
    return max(1, room // max(1, min(costs.step.values())))


def plan_window(
    pending: list[Step],
    plan: Callable[[list[Step]], list[Lane]],
    *,
    used: int,
    budget: int,
    costs: HistoryCosts,
    fresh: bool,
) -> tuple[list[Lane], int] | None:
    """The largest window (the first k pending steps in index order) whose cost fits, as
    (its lanes, the last index it holds); None when nothing fits (continue). `plan` makes a
    window's lanes. A fresh execution always takes at least one step."""
    ordered = sorted(pending, key=lambda s: s.index)
    if not ordered:
        return None
    most = most_steps(used=used, budget=budget, costs=costs)
    if len(ordered) <= most:
        lanes = plan(ordered)
        if fits(used, window_cost(lanes, costs), budget, costs):
            return lanes, -1  # the whole group
    low, high = 0, min(len(ordered) - 1, most)  # the cost grows with k: the largest k that fits
    best: list[Lane] | None = None
    while low < high:
        k = (low + high + 1) // 2
        trial = plan(ordered[:k])
        if fits(used, window_cost(trial, costs), budget, costs):
            low, best = k, trial
        else:
            high = k - 1
    if low == 0:
        if not fresh:
            return None
        low, best = 1, plan(ordered[:1])
    assert best is not None
    return best, ordered[low - 1].index


def rescue_window(
    rescues: list[LaneStep], *, used: int, budget: int, costs: HistoryCosts, fresh: bool
) -> tuple[list[LaneStep], int]:
    """The rescues that fit in this execution (in order) and the events used once they ran;
    none: continue in a fresh execution (which always takes at least one)."""
    room = budget - costs.drive - used - costs.rescue_round
    taken: list[LaneStep] = []
    for rescue in rescues:
        cost = costs.of_step("rescue", sandboxed=rescue.sandboxed)
        if cost > room and not (fresh and not taken):
            break
        taken.append(rescue)
        room -= cost
    spent = sum(costs.of_step("rescue", sandboxed=r.sandboxed) for r in taken)
    return taken, used + (costs.rescue_round + spent if taken else 0)


def within(steps: Collection[Step], through: int) -> list[Step]:
    """The steps a group's settlement looks at after a window up to `through` ran (-1:
    all): the window's flow steps and every rescue (rescues run after the group's last
    window, and their indexes come after every flow step's)."""
    return [s for s in steps if through < 0 or s.index <= through or s.rescue_of is not None]
