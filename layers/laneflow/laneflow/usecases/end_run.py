"""EndRun: close a run (completed, or failed with its reason) and tell the on-end hook;
and closing a run whose drive went away without ending it."""

from __future__ import annotations

import logging

from laneflow.domain.errors import Conflict
from laneflow.domain.messages import (
    DriveRef,
    EndRunRequest,
    LaneStep,
    RunEnded,
    StepCrashedRequest,
)
from laneflow.domain.outline import saved as saved_of
from laneflow.domain.outline import spent as spent_of
from laneflow.domain.records import (
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redaction import scrub_paths
from laneflow.domain.settlement import ACTIVE, BUDGET_SPENT, REJECTED, STOPPED
from laneflow.ports import Services
from laneflow.usecases.chain import start_chained
from laneflow.usecases.fire_schedule import after_run_ended
from laneflow.usecases.next_group import FAILED_BEFORE, FAILED_DURING, RUN_STOPPED
from laneflow.usecases.step_crashed import step_crashed

log = logging.getLogger("laneflow.end_run")


def end_run(svc: Services, req: EndRunRequest) -> RunEnded:
    """Close the run: `failed` with its reason, or `completed`; `finished_at` set. Every way
    a run ends comes here (its drive's EndRun, a stop, a rejection, reconcile closing it),
    so here every step that did not run is skipped with the reason why. A run that already
    ended is left as it is."""
    store = svc.store
    run = store.get_run(req.run.tenant, req.run.run_id, steps=False)
    if run.status.ended:
        # Told again (a re-delivered EndRun): the chained run is started if an earlier telling
        # ended before it could be (made once: its id is derived from this run's).
        _chain(svc, run)
        return RunEnded(run_id=run.id, status=run.status)
    # The run's groups in numbers, not its every step: the steps are read only when some
    # are still to be skipped.
    outline = store.get_group_outline(run.tenant, run.id)
    error = run.error
    if run.stop_requested:
        error = error or STOPPED
    if not error and any(o.unfinished for o in outline):  # flow steps pending or running
        error = "the drive ended with steps not run"
    # Skipped before the run is closed: a crash in between leaves an active run (reconcile
    # closes it again), never an ended run with steps still pending.
    if any(o.waiting for o in outline):
        skip_unrun_steps(svc, run, store.get_steps(run.tenant, run.id), not_run_because(run, error))
    status = RunStatus.failed if error else RunStatus.completed
    # Settle the cost: the run's spend is what its steps (and their rescues) spent, its
    # savings what the prompt cache saved them.
    spent, saved = spent_of(outline), saved_of(outline)
    try:
        run = store.update_run(
            run.tenant,
            run.id,
            RunChanges(status=status, error=error, finished_at=utcnow(), cost_usd=spent, savings_usd=saved, driver=None),
            expect_status=(RunStatus.running, RunStatus.queued, RunStatus.awaiting_approval),
        )
    except Conflict:
        run = store.get_run(run.tenant, run.id, steps=False)
        return RunEnded(run_id=run.id, status=run.status)
    if svc.on_end:
        try:
            svc.on_end(run)
        except Exception:  # the run has ended; a hook's failure must not undo that
            log.exception("on-end hook failed for run %s", run.id)
    _chain(svc, run)
    return RunEnded(run_id=run.id, status=run.status)


def _chain(svc: Services, run: Run) -> None:
    """A completed run whose flow says `then:` starts that flow's run (`usecases.chain`); a
    run a schedule started lets the firing its schedule held for it start
    (`usecases.fire_schedule.after_run_ended`)."""
    try:
        start_chained(svc, run)
    except Exception:  # the run has ended; the chain's failure must not undo that
        log.exception("starting the run chained to %s failed", run.id)
    try:
        after_run_ended(svc, run)
    except Exception:  # likewise
        log.exception("starting the firing held for %s failed", run.id)


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
                run.tenant, run.id, step.index, StepChanges(status=StepStatus.skipped, skip_reason=why), expect_status=waiting
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
            step_crashed(
                svc, StepCrashedRequest(run=ref, step=LaneStep(index=step.index), error={"Error": error, "Cause": cause})
            )
    run = store.get_run(tenant, run_id, steps=False)
    if run.status in ACTIVE:
        try:
            store.update_run(tenant, run_id, RunChanges(error=run.error or reason), expect_status=ACTIVE)
        except Conflict:
            return
        end_run(svc, EndRunRequest(run=ref))
