"""The decisions of a drive: what runs next, what a group's outcome means, how a run ends.

The state machine only orders these; every decision is made here, from the store, so it is
unit-testable without any engine and the same in both engines.
"""

from __future__ import annotations

import logging

from laneflow.domain.flow import Flow
from laneflow.domain.history import history_costs
from laneflow.domain.lanes import plan_lanes, sandboxed_agents
from laneflow.domain.messages import (
    Lane,
    NextGroupRequest,
    Plan,
)
from laneflow.domain.outline import PENDING, StepFilter, first_pending, unsettled
from laneflow.domain.outline import spent as spent_of
from laneflow.domain.records import (
    RunChanges,
    RunStatus,
    Step,
)
from laneflow.domain.settlement import STOPPED, budget_spent
from laneflow.domain.windows import fits, most_steps, plan_window, window_cost
from laneflow.ports import Services
from laneflow.usecases.lane_sizes import lane_sizes
from laneflow.usecases.run_step.handoff import prepare_handoffs

log = logging.getLogger("laneflow.drive")

# Why a step that never ran was skipped when its run ended.
RUN_STOPPED = "run stopped"

FAILED_BEFORE = "the run failed before this step"

FAILED_DURING = "the run failed before this step finished"  # it had begun: an interrupted attempt


def next_group(svc: Services, req: NextGroupRequest) -> Plan:
    """The first group with a pending flow step runs next, as much of it as fits this
    execution's history budget (a window); none left means the run ends, and a window that
    does not fit means the drive continues in a fresh execution."""
    store = svc.store
    costs = history_costs()
    run = store.get_run(req.run.tenant, req.run.run_id, steps=False)
    if run.status != RunStatus.running:
        return Plan(action="end", reason=f"run is {run.status}", used=req.used)
    if run.stop_requested:
        return Plan(action="end", reason=STOPPED, used=req.used)
    outline = store.get_group_outline(run.tenant, run.id)  # one row per group, not every step
    left = unsettled(outline)
    if left is not None:
        settle = costs.group - costs.states.get("RunGroup", 0)
        if req.used and not fits(req.used, settle, svc.settings.history_budget, costs):
            return Plan(action="continue", group=left.group, cycle=left.cycle, used=req.used)
        return Plan(
            action="settle",
            group=left.group,
            cycle=left.cycle,
            reason="an earlier drive left this group unsettled",
            used=req.used + settle,
        )
    first = first_pending(outline)
    if first is None:
        return Plan(action="end", used=req.used)
    spent = budget_spent(run, spent_of(outline))
    if spent:
        store.update_run(run.tenant, run.id, RunChanges(error=spent), expect_status=(RunStatus.running,))
        return Plan(action="end", reason=spent, used=req.used)
    group = first.group
    # Only the window is read: the group's first pending flow steps, as many as could fit what
    # is left of this execution's history (one more says there are more), and each lane's
    # first two steps in the whole group (its lead, and whether it is gated). An approval is a
    # group of its own, so the window shows it.
    most = most_steps(used=req.used, budget=svc.settings.history_budget, costs=costs)
    launching = store.get_steps(
        run.tenant, run.id, group=group, messages=False, where=StepFilter(statuses=PENDING, flow=True, limit=most + 1)
    )
    if any(s.agent is None for s in launching):
        return Plan(action="park", group=group, reason="an approval", used=req.used)
    svc.crashpoints.reached("group-transition")
    flow = Flow.model_validate(run.flow_spec)
    cycle = max(s.cycle for s in launching)
    leads = store.get_steps(run.tenant, run.id, group=group, messages=False, where=StepFilter(flow=True, per_lane=2))

    def plan(window: list[Step]) -> list[Lane]:
        return plan_lanes(
            window,
            flow,
            svc.settings.max_lane_parallel,
            gate=bool(run.options.get("gate", True)),
            sandboxed=sandboxed_agents(run.options),
            group=leads,
            sizes=lane_sizes(svc, run, window),
            registry=svc.settings.prefix_registry,
        )

    window = plan_window(launching, plan, used=req.used, budget=svc.settings.history_budget, costs=costs, fresh=req.used == 0)
    if window is None:
        return Plan(
            action="continue",
            group=group,
            cycle=cycle,
            used=req.used,
            reason="this execution's history budget is spent: the drive goes on in a fresh one",
        )
    lanes, through = window
    planned = [s for s in launching if through < 0 or s.index <= through]
    prepare_handoffs(svc, run, group, cycle, {flow.spec(s.entry, s.slot).handoff for s in planned})
    return Plan(action="run", group=group, cycle=cycle, lanes=lanes, through=through, used=req.used + window_cost(lanes, costs))
