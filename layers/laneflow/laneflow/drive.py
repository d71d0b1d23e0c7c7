"""The decisions of a drive: what runs next, what a group's outcome means, how a run ends.

The state machine only orders these; every decision is made here, from the store, so it is
unit-testable without any engine and the same in both engines.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from .contracts import (
    DriveRef,
    EndRunRequest,
    Lane,
    LaneStep,
    NextGroupRequest,
    Plan,
    RunEnded,
    SettleGroupRequest,
    Settlement,
    StartDriveRequest,
    StepCrashedRequest,
    StepReport,
)
from .errors import AttemptEnded, Conflict
from .control import BUDGET_SPENT, REJECTED, STOPPED, Settler, budget_spent
from .flow import Flow
from .gate import open_gate
from .models import AttemptRef, AttemptStatus, Event, FailureKind, Run, RunStatus, Step, StepStatus, utcnow
from .services import Services
from .crash import crashpoint
from .step import prepare_handoffs, scrub_paths
from .workers import current_worker, dumps

log = logging.getLogger("laneflow.drive")
ACTIVE = (RunStatus.queued, RunStatus.running)
# Why a step that never ran was skipped when its run ended.
RUN_STOPPED = "run stopped"
FAILED_BEFORE = "the run failed before this step"
FAILED_DURING = "the run failed before this step finished"  # it had begun: an interrupted attempt


def start_drive(svc: Services, req: StartDriveRequest, worker: dict | None = None) -> DriveRef:
    """Claim a drive: the run becomes `running`, its drive count grows, `driven_at` is set
    at the first pick-up, and the run records what drives it (its execution in the cloud,
    the local process locally) so reconcile can tell when the drive is gone. A run that
    already ended is left as it is (NextGroup ends it)."""
    store = svc.store
    run = store.get_run(req.tenant, req.run_id, steps=False)
    if run.status not in ACTIVE:
        return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives)
    worker = worker or current_worker()
    driver = {"kind": "sfn", "execution": req.execution} if worker.get("kind") == "lambda" else worker
    changes: dict[str, object] = {"status": RunStatus.running, "execution": req.execution or None, "driver": dumps(driver)}
    if run.driven_at is None:
        changes["driven_at"] = utcnow()
    try:
        run = store.update_run(req.tenant, req.run_id, changes, expect_status=ACTIVE, add_drives=1)
    except Conflict:
        run = store.get_run(req.tenant, req.run_id, steps=False)
    return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives)


def plan_lanes(steps: list[Step], flow: Flow, max_parallel: int, *, gate: bool = False) -> list[Lane]:
    """Group a launching group's steps into lanes keyed by (agent, model), in index order.

    A lane's concurrency is the tightest `parallel:` among its entries (never more than
    `max_parallel`, so the engine's threads stay bounded). With the gate on, a lane of two or
    more steps has a lead (its first step) and siblings, which run at most `parallel - 1`
    at a time beside the lead; a lone step, or a lane capped at one at a time (whose
    siblings start only after the lead ends anyway), has no gate."""
    caps = {(e.index, slot): spec.parallel for e in flow.entries for slot, spec in enumerate(e.steps)}
    lanes: "OrderedDict[tuple[str, str], list[Step]]" = OrderedDict()
    for step in sorted(steps, key=lambda s: s.index):
        lanes.setdefault((step.agent or "", step.model), []).append(step)
    planned = []
    for (agent, model), members in lanes.items():
        limits = [caps.get((s.entry, s.slot)) for s in members]
        parallel = min([c for c in limits if c] + [max_parallel, len(members)])
        parallel = max(1, parallel)
        gated = gate and len(members) > 1 and parallel > 1
        if gated:
            starters = [LaneStep(index=members[0].index, role="lead")]
            siblings = [LaneStep(index=s.index, role="sibling") for s in members[1:]]
        else:
            starters, siblings = [LaneStep(index=s.index, role="solo") for s in members], []
        planned.append(
            Lane(
                key=f"{agent}@{model}",
                agent=agent,
                model=model,
                parallel=parallel,
                starters=starters,
                siblings=siblings,
                sibling_parallel=max(1, parallel - 1),
            )
        )
    return planned


def next_group(svc: Services, req: NextGroupRequest) -> Plan:
    """The first group with a pending flow step runs next; none left means the run ends."""
    store = svc.store
    run = store.get_run(req.run.tenant, req.run.run_id, steps=False)
    if run.status != RunStatus.running:
        return Plan(action="end", reason=f"run is {run.status}")
    if run.stop_requested:
        return Plan(action="end", reason=STOPPED)
    every = store.get_steps(run.tenant, run.id)
    unsettled = unsettled_group(every)
    if unsettled is not None:
        group, cycle = unsettled
        return Plan(action="settle", group=group, cycle=cycle, reason="an earlier drive left this group unsettled")
    steps = [s for s in every if s.rescue_of is None]
    pending = [s for s in steps if s.status in (StepStatus.pending, StepStatus.awaiting_approval)]
    if not pending:
        return Plan(action="end")
    spent = budget_spent(run, sum(s.cost_usd for s in every))
    if spent:
        store.update_run(run.tenant, run.id, {"error": spent}, expect_status=(RunStatus.running,))
        return Plan(action="end", reason=spent)
    group = min(s.group for s in pending)
    launching = [s for s in pending if s.group == group]
    if any(s.agent is None for s in launching):
        return Plan(action="park", group=group, reason="an approval")
    crashpoint("group-transition")
    flow = Flow.model_validate(run.flow_spec)
    lanes = plan_lanes(launching, flow, svc.settings.max_lane_parallel, gate=bool(run.options.get("gate", True)))
    cycle = max(s.cycle for s in launching)
    prepare_handoffs(svc, run, group, cycle, {flow.spec(s.entry, s.slot).handoff for s in launching})
    return Plan(action="run", group=group, cycle=cycle, lanes=lanes)


def unsettled_group(steps: list[Step]) -> tuple[int, int] | None:
    """The earliest group an earlier drive left unsettled: a rescue not finished, or a
    required flow step that failed (its group's settlement never ran). (group, cycle)."""
    found = [
        (s.group, s.cycle)
        for s in steps
        if (s.rescue_of is not None and s.status in (StepStatus.pending, StepStatus.running))
        or (s.rescue_of is None and s.status == StepStatus.failed and not s.optional)
    ]
    return min(found) if found else None


def step_crashed(svc: Services, req: StepCrashedRequest) -> StepReport:
    """The Catch of RunStep: its worker failed in a way the handler could not record (a
    crash, a Lambda timeout). End whatever attempt is still running, with the error's name,
    so the step is not left `running` with nothing working on it."""
    store, tenant, run_id, index = svc.store, req.run.tenant, req.run.run_id, req.step.index
    error = str(req.error.get("Error") or "Error")
    cause = str(req.error.get("Cause") or "")
    reason = scrub_paths(f"the step's worker failed ({error})" + (f": {cause[:300]}" if cause else ""))
    step = store.get_step(tenant, run_id, index)
    if step.status == StepStatus.running:
        for attempt in store.list_attempts(tenant, run_id, index):
            if attempt.status == AttemptStatus.running:
                try:
                    store.end_attempt(
                        AttemptRef.of(tenant, attempt),
                        AttemptStatus.failed,
                        reason=reason,
                        step={"status": StepStatus.failed, "error": reason, "finished_at": utcnow()},
                        reason_kind=FailureKind.worker,
                    )
                except AttemptEnded:
                    pass
        step = store.get_step(tenant, run_id, index)
    if step.status in (StepStatus.pending, StepStatus.running):
        try:
            step = store.update_step(
                tenant,
                run_id,
                index,
                {"status": StepStatus.failed, "error": reason, "finished_at": utcnow()},
                expect_status=(StepStatus.pending, StepStatus.running),
            )
        except Conflict:
            step = store.get_step(tenant, run_id, index)
    store.add_event(tenant, run_id, index, Event(type="error", text=reason))
    if req.step.role == "lead":
        open_gate(svc, tenant, run_id, group=req.group, cycle=req.cycle, lane=req.lane, lead=index, why="the lead's worker failed")
    return StepReport(index=index, status=step.status, attempts=step.attempts)


def settle_group(svc: Services, req: SettleGroupRequest) -> Settlement:
    """What a finished group means for the run (control.py): the next group, rescues,
    a loop back, or the end (its reason kept on the run)."""
    run = svc.store.get_run(req.run.tenant, req.run.run_id, steps=False)
    # The run's cost is settled once per group (steps carry their own as they end).
    spent = round(sum(s.cost_usd for s in svc.store.get_steps(run.tenant, run.id)), 6)
    if spent != run.cost_usd:
        try:
            run = svc.store.update_run(run.tenant, run.id, {"cost_usd": spent}, expect_status=(RunStatus.running,))
        except Conflict:
            pass
    settled = Settler(svc, run, req.group).settle()
    if settled.action == "end" and settled.reason and settled.reason != STOPPED:
        try:
            svc.store.update_run(run.tenant, run.id, {"error": settled.reason}, expect_status=(RunStatus.running,))
        except Conflict:
            pass
    return settled


def end_run(svc: Services, req: EndRunRequest) -> RunEnded:
    """Close the run: `failed` with its reason, or `completed`; `finished_at` set. Every way
    a run ends comes here (its drive's EndRun, a stop, a rejection, reconcile closing it),
    so here every step that did not run is skipped with the reason why. A run that already
    ended is left as it is."""
    store = svc.store
    run = store.get_run(req.run.tenant, req.run.run_id, steps=False)
    if run.status.ended:
        return RunEnded(run_id=run.id, status=run.status)
    steps = store.get_steps(run.tenant, run.id)
    error = run.error
    if run.stop_requested:
        error = error or STOPPED
    if not error and any(s.status in (StepStatus.pending, StepStatus.running) and s.rescue_of is None for s in steps):
        error = "the drive ended with steps not run"
    # Skipped before the run is closed: a crash in between leaves an active run (reconcile
    # closes it again), never an ended run with steps still pending.
    if skip_unrun_steps(svc, run, steps, not_run_because(run, error)):
        steps = store.get_steps(run.tenant, run.id)
    status = RunStatus.failed if error else RunStatus.completed
    # Settle the cost: the run's spend is what its steps (and their rescues) spent.
    spent = round(sum(s.cost_usd for s in steps), 6)
    try:
        run = store.update_run(
            run.tenant,
            run.id,
            {"status": status, "error": error, "finished_at": utcnow(), "cost_usd": spent, "driver": None},
            expect_status=(RunStatus.running, RunStatus.queued, RunStatus.awaiting_approval),
        )
    except Conflict:
        run = store.get_run(run.tenant, run.id, steps=False)
        return RunEnded(run_id=run.id, status=run.status)
    if svc.on_end:
        try:
            svc.on_end(run)
        except Exception:  # noqa: BLE001 - the run has ended; a hook's failure must not undo that
            log.exception("on-end hook failed for run %s", run.id)
    return RunEnded(run_id=run.id, status=run.status)


def not_run_because(run: Run, error: str | None) -> str:
    """Why the steps a run never ran were not run, from how it ended."""
    if run.stop_requested:
        return RUN_STOPPED
    if error == REJECTED:
        return REJECTED
    if error and error.startswith(BUDGET_SPENT):
        return BUDGET_SPENT
    return FAILED_BEFORE


def skip_unrun_steps(svc: Services, run: Run, steps: list[Step], reason: str) -> bool:
    """Mark `skipped` (with `reason`) every step, rescue records included, still `pending`
    or `awaiting-approval`: a run that ends leaves no step pending. True if any was."""
    waiting = (StepStatus.pending, StepStatus.awaiting_approval)
    skipped = False
    for step in steps:
        if step.status not in waiting:
            continue
        why = FAILED_DURING if reason == FAILED_BEFORE and step.attempts else reason
        try:
            svc.store.update_step(
                run.tenant, run.id, step.index, {"status": StepStatus.skipped, "skip_reason": why}, expect_status=waiting
            )
            skipped = True
        except Conflict:  # it started or ended meanwhile: its own record says how
            pass
    return skipped


def close_run(svc: Services, tenant: str, run_id: str, *, error: str, cause: str = "") -> None:
    """Close a run whose drive went away without ending it (a crashed definition, an
    interrupted local runner): end the attempts it left running, then fail the run with the
    reason, so nothing stays `running` with nothing working on it."""
    store = svc.store
    reason = scrub_paths(f"the drive failed ({error})" + (f": {cause[:300]}" if cause else ""))
    ref = DriveRef(tenant=tenant, run_id=run_id)
    for step in store.get_steps(tenant, run_id):
        if step.status == StepStatus.running:
            step_crashed(svc, StepCrashedRequest(run=ref, step=LaneStep(index=step.index), error={"Error": error, "Cause": cause}))
    run = store.get_run(tenant, run_id, steps=False)
    if run.status in ACTIVE:
        try:
            store.update_run(tenant, run_id, {"error": run.error or reason}, expect_status=ACTIVE)
        except Conflict:
            return
        end_run(svc, EndRunRequest(run=ref))
