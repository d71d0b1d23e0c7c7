"""The pure rules of a group's settlement: loop markers and targets, rescue instructions,
the run budget, the reasons recorded with them, and what a settled group means.

SettleGroup reads the store, and these rules decide from what it read, in this order:
`tidy` says what is recorded before anything is decided (finished rescues onto the steps
they took over, steps nothing works on any more), and `decide`, from the steps as they are
after that, says what the group means: a stop ends the run; an evaluator loop whose reply
lacks its marker goes back (or, out of cycles, fails its checker); a failed required step
with `on_fail` gets its one rescue; a required step that stays failed ends the run; else
the next group. The use case (`usecases/settle_group.py`) writes what they say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from laneflow.domain.flow import Flow, StepSpec
from laneflow.domain.records import (
    Run,
    RunStatus,
    Step,
    StepStatus,
)

ACTIVE = (RunStatus.queued, RunStatus.running)


STOPPED = "stopped by a person"

REJECTED = "rejected by a person"

BUDGET_SPENT = "budget spent"

SUPERSEDED = "superseded on resume"

_TRAILING = " \t\r\n.!*_`'\""


def ends_with_marker(reply: str | None, marker: str) -> bool:
    """Does the reply end with the marker (trailing spaces, punctuation and emphasis aside)?"""
    return bool(reply and reply.rstrip(_TRAILING).endswith(marker.rstrip(_TRAILING)))


def loop_target_group(flow: Flow, checker: Step, agent: str) -> int:
    """The group of the `loop:` agent: the latest entry at or before the checker's naming it."""
    for group in range(checker.group, -1, -1):
        entry = flow.entries[group]
        if any(spec.agent == agent for spec in entry.steps):
            return group
    return checker.group  # validated away by flow.py; a safe fallback


def rescue_instruction(step: Step, spec: StepSpec, error: str | None) -> str:
    parts = [
        step.instruction.strip() or f"Do the part of the flow given to {step.agent}.",
        f"This step was given to {step.agent} and failed: {error or 'no reason recorded'}. Take it over and do what it asked.",
    ]
    if spec.until:
        parts.append(f"Your reply must end with {spec.until}.")
    return "\n\n".join(parts)


def budget_spent(run: Run, spent: float | None = None) -> str | None:
    """The reason no group, no step and no model turn may start: the run's spend (its
    steps', when given; else its `cost_usd`, which each attempt adds to as it ends) has
    reached its budget."""
    budget = run_budget(run)
    spent = run.cost_usd if spent is None else spent
    if budget is not None and spent >= budget:
        return spent_line(spent, budget)
    return None


def run_budget(run: Run) -> float | None:
    """The run's budget in USD (its flow's `budget:`, else its workspace's, fixed as it
    started), or None."""
    budget = run.options.get("budget")
    return float(budget) if budget else None


def spent_line(spent: float, budget: float) -> str:
    return f"{BUDGET_SPENT}: ${spent:.4f} of ${budget:.2f}"


def turn_refused(spent: float, budget: float, turn: int) -> str:
    """Why a running step was refused its next model turn: it fails with this (not retried),
    and its run ends "budget spent"."""
    return f"{spent_line(spent, budget)}: the run's budget was reached before this step's model turn {turn}"


def stopped_by_budget(step: Step) -> bool:
    """The step failed because the run's budget refused it a model turn, not by its own doing."""
    return step.status == StepStatus.failed and (step.error or "").startswith(BUDGET_SPENT)


# -- what a settled group means -------------------------------------------------------------


@dataclass(frozen=True)
class Tidying:
    """What a settlement records before it decides anything."""

    rescued: tuple[tuple[Step, Step], ...] = ()  # (the step taken over, its completed rescue)
    rescue_failed: tuple[tuple[Step, str], ...] = ()  # (the step taken over, its error with the rescue's)
    abandoned: tuple[int, ...] = ()  # flow steps still pending or running: nothing works on them now


@dataclass(frozen=True)
class Exhausted:
    """An evaluator loop out of cycles: its checker fails with this reason."""

    index: int
    reason: str


@dataclass(frozen=True)
class LoopBack:
    """An evaluator loop goes back: its steps start a new cycle, told what the checker said."""

    checker: int  # the step whose reply lacked the marker
    group: int  # the group the new cycle starts from
    cycle: int
    reset: tuple[int, ...]  # the flow steps set pending again
    feedback: str  # what the new cycle is told


@dataclass(frozen=True)
class NewRescue:
    """A rescue to add: `agent` (the step's `on_fail`) takes over `of` as step `index`."""

    of: Step
    spec: StepSpec
    index: int
    agent: str
    instruction: str


@dataclass(frozen=True)
class RescuePlan:
    """The one rescue of one failed step: an unfinished one kept (its extra copies skipped),
    or a new one."""

    of: int
    supersede: tuple[int, ...] = ()
    resume: Step | None = None  # an unfinished rescue (pending, or running with nothing on it)
    new: NewRescue | None = None


@dataclass(frozen=True)
class Decision:
    """What a settled group means, and what is written for it. `action` and `reason` are the
    answer when every rescue planned launches; should none (a resumed rescue that ended
    meanwhile), the answer is the end for `unrescued`, or the next group without one."""

    action: Literal["next", "rescue", "loop", "end"]
    reason: str | None = None
    exhausted: tuple[Exhausted, ...] = ()
    loop: LoopBack | None = None
    rescues: tuple[RescuePlan, ...] = ()
    unrescued: str | None = None


def tidy(run: Run, steps: list[Step]) -> Tidying:
    """What a group's steps need recorded before its settlement decides: each finished
    rescue onto the failed step it took over (its result, or its failure noted once), and
    the flow steps nothing works on any more. A stopped run records nothing."""
    if run.stop_requested:
        return Tidying()
    by_index = {s.index: s for s in steps}
    rescued, failed = [], []
    for rescue in steps:
        if rescue.rescue_of is None or not rescue.status.ended or rescue.status == StepStatus.skipped:
            continue
        target = by_index.get(rescue.rescue_of)
        if target is None or target.status != StepStatus.failed or target.cycle != rescue.cycle:
            continue
        if rescue.status == StepStatus.completed:
            rescued.append((target, rescue))
            continue
        note = f"its rescue (step {rescue.index}, {rescue.agent}) failed too"
        if note not in (target.error or ""):
            failed.append((target, f"{target.error}; {note}: {rescue.error}"))
    abandoned = [s.index for s in steps if s.rescue_of is None and s.status in (StepStatus.pending, StepStatus.running)]
    return Tidying(rescued=tuple(rescued), rescue_failed=tuple(failed), abandoned=tuple(abandoned))


def decide(
    run: Run, flow: Flow, group: int, steps: list[Step], *, next_index: int | None = None, spent: float | None = None
) -> Decision:
    """What group `group` means for the run, from the run and its steps as read after
    `tidy`'s records: the end (a stop, the budget, a required failure), a loop back,
    rescues, or the next group. `steps` must hold the group's steps and those of the groups
    its `until:` steps loop back to; `next_index` (the index a new rescue gets) and `spent`
    (the run's cost) default to what `steps` say, when they are all of the run's."""
    if run.stop_requested:
        return Decision(action="end", reason=STOPPED)
    members = [s for s in steps if s.group == group]
    exhausted, loop = _check_loops(flow, members, steps)
    if loop is not None:
        return Decision(action="loop", reason=_loop_text(flow, members, loop), exhausted=exhausted, loop=loop)
    ended = {e.index: e.reason for e in exhausted}
    members = [
        s.model_copy(update={"status": StepStatus.failed, "error": ended[s.index]}) if s.index in ended else s for s in members
    ]
    if next_index is None:
        next_index = max((s.index for s in steps), default=-1) + 1
    plans, failed = _plan_rescues(flow, members, next_index=next_index)
    unrescued = _failure_reason(failed)
    # A rescue does not start once the budget is spent, and a failure that is only the
    # budget's refusal of a model turn ends the run for the budget's reason.
    if plans or (failed and all(stopped_by_budget(s) for s in failed)):
        budget = budget_spent(run, sum(s.cost_usd for s in steps) if spent is None else spent)
        if budget:
            return Decision(action="end", reason=budget, exhausted=exhausted, rescues=plans, unrescued=unrescued)
    if plans:
        return Decision(action="rescue", exhausted=exhausted, rescues=plans, unrescued=unrescued)
    if unrescued:
        return Decision(action="end", reason=unrescued, exhausted=exhausted, unrescued=unrescued)
    return Decision(action="next", exhausted=exhausted)


def _check_loops(flow: Flow, members: list[Step], steps: list[Step]) -> tuple[tuple[Exhausted, ...], LoopBack | None]:
    """Evaluator loops in step order: a completed `until:` step whose reply lacks its marker
    fails past `max_cycles`, else the first such step loops back (later ones wait for it)."""
    exhausted = []
    for step in members:
        if step.rescue_of is not None or step.status != StepStatus.completed:
            continue
        spec = flow.spec(step.entry, step.slot)
        if not spec.until or not spec.loop or ends_with_marker(step.conclusion or step.result, spec.until):
            continue
        max_cycles = spec.max_cycles or 3
        if step.cycle + 1 >= max_cycles:
            exhausted.append(Exhausted(step.index, f"its reply did not end with {spec.until} after {max_cycles} cycle(s)"))
            continue
        target = loop_target_group(flow, step, spec.loop)
        cycle = step.cycle + 1
        reset = tuple(s.index for s in steps if s.rescue_of is None and target <= s.group <= step.group)
        verdict = (step.conclusion or step.result or "").strip()
        feedback = f"## What {step.agent} said about the last cycle (it did not end with {spec.until})\n\n{verdict}"
        return tuple(exhausted), LoopBack(checker=step.index, group=target, cycle=cycle, reset=reset, feedback=feedback)
    return tuple(exhausted), None


def _loop_text(flow: Flow, members: list[Step], loop: LoopBack) -> str:
    checker = next(s for s in members if s.index == loop.checker)
    spec = flow.spec(checker.entry, checker.slot)
    return (
        f"loop: no {spec.until} at the end of the reply; cycle {loop.cycle + 1} of {spec.max_cycles or 3} from group {loop.group}"
    )


def _plan_rescues(flow: Flow, members: list[Step], *, next_index: int) -> tuple[tuple[RescuePlan, ...], list[Step]]:
    """One rescue per failed required step with `on_fail` (across drives: a leftover
    unfinished one is kept, its extra copies superseded); the failed steps no rescue saves."""
    rescues = [s for s in members if s.rescue_of is not None]
    plans: list[RescuePlan] = []
    failed: list[Step] = []
    for step in members:
        if step.rescue_of is not None or step.status != StepStatus.failed or step.optional:
            continue
        spec = flow.spec(step.entry, step.slot)
        mine = [r for r in rescues if r.rescue_of == step.index and r.cycle == step.cycle]
        if not spec.on_fail or any(r.status in (StepStatus.completed, StepStatus.failed) for r in mine):
            failed.append(step)  # no rescue, or its one rescue already ended without saving it
            continue
        unfinished = sorted((r for r in mine if r.status in (StepStatus.pending, StepStatus.running)), key=lambda r: r.index)
        supersede = tuple(r.index for r in unfinished[1:])
        if unfinished:
            plans.append(RescuePlan(of=step.index, supersede=supersede, resume=unfinished[0]))
            continue
        new = NewRescue(
            of=step, spec=spec, index=next_index, agent=spec.on_fail, instruction=rescue_instruction(step, spec, step.error)
        )
        next_index += 1
        plans.append(RescuePlan(of=step.index, supersede=supersede, new=new))
    return tuple(plans), failed


def _failure_reason(failed: list[Step]) -> str | None:
    if not failed:
        return None
    first = failed[0]
    item = f" ({first.item})" if first.item is not None and not isinstance(first.item, (dict, list)) else ""
    reason = f"step {first.index} ({first.agent}{item}) failed: {first.error or 'no reason recorded'}"
    if len(failed) > 1:
        reason += f" (and {len(failed) - 1} more)"
    return reason
