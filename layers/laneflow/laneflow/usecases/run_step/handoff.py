"""Handoffs: the previous group's completed results a launching group's steps receive,
built once per group, and a loop's feedback for the group its new cycle starts at."""

from __future__ import annotations

import json

from laneflow.domain.records import (
    Run,
    Step,
    StepStatus,
)
from laneflow.ports import Services

# -- what the model is told ------------------------------------------------------------------


def build_handoff(svc: Services, run: Run, group: int, kind: str) -> str:
    """The handoff block for the steps of `group`: the previous group's completed results
    (rescue records never count: a rescued step carries its rescue's result). Approval
    groups are passed over."""
    if kind == "none":
        return ""
    previous: list[Step] = []
    group -= 1
    while group >= 0:
        previous = [s for s in svc.store.get_steps(run.tenant, run.id, group=group, messages=False) if s.rescue_of is None]
        if any(s.agent for s in previous):
            break
        group -= 1
    parts = []
    for s in previous:
        if s.status != StepStatus.completed or not s.agent:
            continue
        item = "" if s.item is None else f" — {s.item if isinstance(s.item, str) else json.dumps(s.item, ensure_ascii=False)}"
        if kind == "conclusions":
            body = s.conclusion or ""
        elif kind == "data":
            body = json.dumps(s.data, ensure_ascii=False, indent=2)
        else:
            body = s.result or ""
        parts.append(f"### {s.agent}{item} (step {s.index})\n{body.strip()}")
    if not parts:
        return ""
    return "## Handoff from the previous group\n\n" + "\n\n".join(parts)


def handoff_key(group: int, cycle: int, kind: str) -> str:
    return f"g{group}c{cycle}:{kind}"


def feedback_key(group: int, cycle: int) -> str:
    """Where a loop keeps what its checking step said, for the group the new cycle starts at."""
    return f"feedback:g{group}c{cycle}"


def prepare_handoffs(svc: Services, run: Run, group: int, cycle: int, kinds: set[str]) -> None:
    """Build each handoff block a launching group needs once, for all of its steps (a
    fan-out of N would otherwise read the previous group N times)."""
    for kind in sorted(kinds - {"none"}):
        svc.store.put_handoff(run.tenant, run.id, handoff_key(group, cycle, kind), build_handoff(svc, run, group, kind))


def handoff_for(svc: Services, run: Run, step: Step, kind: str, *, group: int, cycle: int) -> str:
    """The block the planner prepared for this step's group (else built now), and, in a new
    loop cycle, what the checking step said about the last one (whatever the handoff kind)."""
    block = ""
    if kind != "none":
        prepared = svc.store.get_handoff(run.tenant, run.id, handoff_key(group, cycle, kind))
        block = prepared if prepared is not None else build_handoff(svc, run, step.group, kind)
    feedback = svc.store.get_handoff(run.tenant, run.id, feedback_key(group, cycle)) if cycle else None
    return "\n\n".join(part for part in (block, feedback) if part)
