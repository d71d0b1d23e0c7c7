"""Lanes: a launching group's steps keyed by agent and model, each with its lead and its
siblings, and the gate's key and trace line."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping

from laneflow.domain.flow import Flow
from laneflow.domain.messages import (
    Lane,
    LaneKey,
)
from laneflow.domain.prefixes import registered
from laneflow.domain.records import (
    Step,
)
from laneflow.domain.sizes import task_overrides


def gate_key(group: int, cycle: int, lane: str | LaneKey) -> str:
    """One gate per lane (agent + model) per launching of a group."""
    return f"g{group}c{cycle}:{lane}"


def gate_id(tenant: str, run_id: str, key: str) -> str:
    """A gate's name across processes (one lane of one launching of one run's group)."""
    return f"{tenant}/{run_id}/{key}"


def waiting_line(agent: str) -> str:
    return f"prompt cache: waiting for the first {agent} step's reply before starting, so this one reads its prefix"


def plan_lanes(
    steps: list[Step],
    flow: Flow,
    max_parallel: int,
    *,
    gate: bool = False,
    sandboxed: Collection[str] = (),
    group: Collection[Step] | None = None,
    sizes: Mapping[str, str] | None = None,
    registry: bool = True,
) -> list[Lane]:
    """Group a launching group's steps into lanes keyed by (agent, model), in index order.

    A lane's concurrency is the tightest `parallel:` among its entries (never more than
    `max_parallel`, so the engine's threads stay bounded). With the gate on, a lane of two or
    more steps has a lead (its first step) and siblings, whose Map runs `parallel` at a
    time: the sibling that would pass the cap while the lead runs waits for the lead's end
    (laneflow.domain.gate), so the gate never lowers the lane's concurrency. A lone step, or
    a lane capped at one at a time (whose siblings start only after the lead ends anyway),
    has no gate. A gated lane's lead, and a lone step, first wait for another run's writer
    of their prefix (`prefix_wait`: the gate across runs). A lane whose agent is in
    `sandboxed` runs its steps in sandbox workers (all steps of a lane share its agent).

    `steps` may be a window of the group (`group`, all its flow steps): a lane's lead is its
    first step in the whole group, so a window without it has siblings only, which find the
    gate its lead opened in an earlier window; whether a lane is gated is decided by its
    size in the whole group."""
    caps = {(e.index, slot): spec.parallel for e in flow.entries for slot, spec in enumerate(e.steps)}
    lanes: OrderedDict[LaneKey, list[Step]] = OrderedDict()
    for step in sorted(steps, key=lambda s: s.index):
        lanes.setdefault(LaneKey(step.agent or "", step.model), []).append(step)
    whole: dict[LaneKey, list[int]] = {}
    for step in sorted(group if group is not None else steps, key=lambda s: s.index):
        if step.rescue_of is None:
            whole.setdefault(LaneKey(step.agent or "", step.model), []).append(step.index)
    planned = []
    for lane, members in lanes.items():
        limits = [caps.get((s.entry, s.slot)) for s in members]
        parallel = min([c for c in limits if c] + [max_parallel, len(members)])
        parallel = max(1, parallel)
        indexes = whole.get(lane) or [s.index for s in members]
        gated = gate and len(indexes) > 1 and min([c for c in limits if c] + [max_parallel, len(indexes)]) > 1
        if gated and members[0].index == indexes[0]:
            starters, siblings = [members[0].index], [s.index for s in members[1:]]
        elif gated:
            starters, siblings = [], [s.index for s in members]
        else:
            starters, siblings = [s.index for s in members], []
        planned.append(
            Lane(
                key=str(lane),
                agent=lane.agent,
                model=lane.model,
                parallel=parallel,
                starters=starters,
                siblings=siblings,
                starter_role="lead" if gated else "solo",
                sibling_parallel=parallel,
                prefix_wait=registry and gate and bool(starters) and (gated or len(indexes) == 1) and registered(lane.model),
                sandboxed=lane.agent in sandboxed,
                task=task_overrides((sizes or {}).get(lane.agent)),
            )
        )
    return planned


SANDBOXED = "sandboxed"  # the run option naming the agents whose steps run in a sandbox worker


def sandboxed_agents(options: dict[str, object]) -> frozenset[str]:
    """The agents of a run whose steps run in a sandbox worker (as its start recorded them)."""
    names = options.get(SANDBOXED) or []
    return frozenset(str(n) for n in names) if isinstance(names, list) else frozenset()
