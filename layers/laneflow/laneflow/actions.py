"""What people do to runs: park at an approval, answer it, stop a run (DESIGN section 4).

Stopping is one-way: `request_stop` is the only write of `stop_requested`, and no other save
names it. A run with a drive sees the stop at its next decision (and its running steps at
their next check); a run with no drive (parked, or queued) is closed here at once. Park and
stop each write, then read the other's write, so a stop racing a park never leaves a run
parked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contracts import DriveRef, EndRunRequest, ParkRequest, RunEnded
from .control import REJECTED
from .crash import crashpoint
from .drive import end_run
from .errors import Conflict, LaneflowError
from .models import Event, Run, RunStatus, StepStatus, utcnow
from .services import Services


class RunNotWaiting(LaneflowError):
    """An approval was answered for a run that is not waiting for one."""

    exit_code = 2
    http_status = 409


def park_run(svc: Services, req: ParkRequest) -> RunEnded:
    """The drive reached an approval: the run waits for a person, holding no worker."""
    store, tenant, run_id = svc.store, req.run.tenant, req.run.run_id
    for step in store.get_steps(tenant, run_id, group=req.group):
        if step.agent is None and step.status == StepStatus.pending:
            store.update_step(tenant, run_id, step.index, {"status": StepStatus.awaiting_approval}, expect_status=(StepStatus.pending,))
            store.add_event(tenant, run_id, step.index, Event(text=f"waiting for a person: {step.instruction}"))
    try:
        run = store.update_run(
            tenant, run_id, {"status": RunStatus.awaiting_approval, "parked_at": utcnow(), "execution": None, "driver": None},
            expect_status=(RunStatus.running,),
        )
    except Conflict:
        run = store.get_run(tenant, run_id, steps=False)
    if store.get_run(tenant, run_id, steps=False).stop_requested:
        run = _close(svc, run)  # a stop came while parking: nothing stays parked
    crashpoint("parked")
    return RunEnded(run_id=run.id, status=run.status)


def _close(svc: Services, run: Run) -> Run:
    end_run(svc, EndRunRequest(run=DriveRef(tenant=run.tenant, run_id=run.id)))
    return svc.store.get_run(run.tenant, run.id, steps=False)


@dataclass
class StopOutcome:
    run: Run
    message: str


def stop_run(svc: Services, tenant: str, run_id: str) -> StopOutcome:
    """Ask a run to stop. A run with no drive (parked or queued) is closed at once; a running
    one ends at its drive's next decision, its running steps at their next check."""
    store = svc.store
    run = store.get_run(tenant, run_id, steps=False)
    if run.status.ended:
        already = "already stopped" if run.stop_requested else "already ended"
        return StopOutcome(run, f"run {run_id} {already} ({run.status})")
    newly = store.request_stop(tenant, run_id)
    run = store.get_run(tenant, run_id, steps=False)
    if run.status in (RunStatus.awaiting_approval, RunStatus.queued):
        run = _close(svc, run)
        return StopOutcome(run, f"run {run_id} stopped")
    if not newly:
        return StopOutcome(run, f"run {run_id} already stopped: it is ending")
    return StopOutcome(run, f"run {run_id}: stop requested; its running steps end at their next check")


def answer_approval(svc: Services, tenant: str, run_id: str, *, approve: bool) -> Run:
    """Approve (the run is queued for a new drive: the caller starts it) or reject (the run
    fails with "rejected by a person")."""
    store = svc.store
    run = store.get_run(tenant, run_id, steps=False)
    waiting = [s for s in store.get_steps(tenant, run_id) if s.status == StepStatus.awaiting_approval]
    if run.status != RunStatus.awaiting_approval or not waiting:
        raise RunNotWaiting(f"run {run_id} is not waiting for an approval (it is {run.status})")
    step = waiting[0]
    now = utcnow()
    if approve:
        store.update_step(
            tenant, run_id, step.index, {"status": StepStatus.completed, "result": "approved by a person", "finished_at": now},
            expect_status=(StepStatus.awaiting_approval,),
        )
        store.add_event(tenant, run_id, step.index, Event(text="approved by a person"))
        return store.update_run(tenant, run_id, {"status": RunStatus.queued}, expect_status=(RunStatus.awaiting_approval,))
    store.update_step(
        tenant, run_id, step.index, {"status": StepStatus.failed, "error": REJECTED, "finished_at": now},
        expect_status=(StepStatus.awaiting_approval,),
    )
    store.add_event(tenant, run_id, step.index, Event(type="error", text=REJECTED))
    # The steps after it are skipped ("rejected by a person") where every run's end skips them.
    store.update_run(tenant, run_id, {"error": REJECTED}, expect_status=(RunStatus.awaiting_approval,))
    return _close(svc, store.get_run(tenant, run_id, steps=False))
