"""A run's groups in numbers: what NextGroup and SettleGroup decide on without reading every
step of the run (`Store.get_group_outline`). A run of 100 groups of 10 read its 1,000 steps whole
at every group; the outline is one row per group, and only the group a decision is about is
read whole."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from laneflow.domain.records import StepStatus

PENDING = frozenset({StepStatus.pending.value, StepStatus.awaiting_approval.value})

UNFINISHED = frozenset({StepStatus.pending.value, StepStatus.running.value})


@dataclass(frozen=True)
class StepFacts:
    """What the outline counts of one step."""

    index: int
    group: int
    cycle: int
    status: str
    rescue: bool
    optional: bool
    cost_usd: float
    savings_usd: float = 0.0


@dataclass(frozen=True)
class GroupOutline:
    """One group of a run: its flow steps still to run, its required failures, its rescues not
    finished, its cost and savings (rescues included), its highest cycle and its highest step
    index; and for a run's end, its flow steps pending or running and its steps (rescues too)
    waiting."""

    group: int
    cycle: int = 0
    pending: int = 0  # flow steps pending or awaiting approval
    failed_required: int = 0  # flow steps failed that are not optional
    unfinished_rescues: int = 0  # rescues pending or running
    cost_usd: float = 0.0
    last_index: int = -1
    unfinished: int = 0  # flow steps pending or running (not those awaiting approval)
    waiting: int = 0  # steps, rescues included, pending or awaiting approval (what a run's end skips)
    savings_usd: float = 0.0  # what the prompt cache saved its steps (rescues included)


def outline_of(facts: Iterable[StepFacts]) -> list[GroupOutline]:
    """The outline of a run's steps, by group."""
    groups: dict[int, dict[str, float]] = {}
    for f in facts:
        g = groups.setdefault(
            f.group,
            {
                "cycle": 0,
                "pending": 0,
                "failed_required": 0,
                "unfinished_rescues": 0,
                "cost_usd": 0.0,
                "last_index": -1,
                "unfinished": 0,
                "waiting": 0,
                "savings_usd": 0.0,
            },
        )
        g["cost_usd"] += f.cost_usd
        g["savings_usd"] += f.savings_usd
        g["last_index"] = max(g["last_index"], f.index)
        g["waiting"] += f.status in PENDING
        if f.rescue:
            g["unfinished_rescues"] += f.status in UNFINISHED
            continue
        g["cycle"] = max(g["cycle"], f.cycle)
        g["pending"] += f.status in PENDING
        g["unfinished"] += f.status in UNFINISHED
        g["failed_required"] += f.status == StepStatus.failed.value and not f.optional
    return [
        GroupOutline(
            group=n,
            cycle=int(g["cycle"]),
            pending=int(g["pending"]),
            failed_required=int(g["failed_required"]),
            unfinished_rescues=int(g["unfinished_rescues"]),
            cost_usd=round(g["cost_usd"], 6),
            last_index=int(g["last_index"]),
            unfinished=int(g["unfinished"]),
            waiting=int(g["waiting"]),
            savings_usd=round(g["savings_usd"], 6),
        )
        for n, g in sorted(groups.items())
    ]


def unsettled(outline: list[GroupOutline]) -> GroupOutline | None:
    """The earliest group an earlier drive left unsettled: a rescue not finished, or a
    required flow step that failed while none of the group is left to run (a group with
    steps still to run, its later windows, is under way)."""
    return next((o for o in outline if o.unfinished_rescues or (o.failed_required and not o.pending)), None)


def first_pending(outline: list[GroupOutline]) -> GroupOutline | None:
    return next((o for o in outline if o.pending), None)


def spent(outline: list[GroupOutline]) -> float:
    return round(sum(o.cost_usd for o in outline), 6)


def saved(outline: list[GroupOutline]) -> float:
    """What the prompt cache saved the run: its steps' `savings_usd`, summed."""
    return round(sum(o.savings_usd for o in outline), 6)


@dataclass(frozen=True)
class StepFilter:
    """Which of a run's (or a group's) steps a read returns (`Store.get_steps(where=...)`),
    so that a decision reads what it decides on: a window's decision its window, not the
    whole group (a fan-out of 10,000 in 8 windows read its 10,000 steps whole three times a
    window); a cache_break its agent's steps that had started. Each field left at None
    filters nothing; the steps still come by index."""

    statuses: frozenset[str] | None = None  # only steps in one of these statuses
    # Only the steps a group's settlement decides on when its flow has no `until:` step:
    # every rescue, and every flow step that neither completed nor was skipped (a fan-out of
    # 100,000 that went well is settled on none of its steps, not on all of them).
    settling: bool = False
    flow: bool = False  # only flow steps (no rescues)
    low: int | None = None  # only indexes from this one
    high: int | None = None  # only indexes up to this one
    agent: str | None = None  # only this agent's steps
    started_by: str | None = None  # only steps that started, at this time or before
    per_lane: int | None = None  # only each (agent, model)'s first this many (after the filters above)
    limit: int | None = None  # only the first this many (after all of the above)


def statuses(*these: StepStatus) -> frozenset[str]:
    return frozenset(s.value for s in these)
