"""A person answers a parked run's approval: approve (queued for a new drive) or reject."""

from __future__ import annotations

from laneflow.domain.errors import LaneflowError
from laneflow.domain.records import Event, EventType, Run, RunChanges, RunStatus, StepChanges, StepStatus, utcnow
from laneflow.domain.settlement import REJECTED
from laneflow.ports import Services
from laneflow.usecases.end_run import skip_unrun_steps
from laneflow.usecases.stop import _close, with_reason


class RunNotWaiting(LaneflowError):
    """An approval was answered for a run that is not waiting for one."""

    exit_code = 2
    http_status = 409


def answer_approval(svc: Services, tenant: str, run_id: str, *, approve: bool, reason: str | None = None) -> Run:
    """Approve (the run is queued for a new drive: the caller starts it) or reject (the run
    fails with "rejected by a person"). The person's `reason`, when given, is said in the
    approval step's trace and, on a rejection, in its error and the run's ("rejected by a
    person: REASON")."""
    store = svc.store
    run = store.get_run(tenant, run_id, steps=False)
    waiting = [s for s in store.get_steps(tenant, run_id) if s.status == StepStatus.awaiting_approval]
    if run.status != RunStatus.awaiting_approval or not waiting:
        raise RunNotWaiting(f"run {run_id} is not waiting for an approval (it is {run.status})")
    step = waiting[0]
    now = utcnow()
    if approve:
        store.update_step(
            tenant,
            run_id,
            step.index,
            StepChanges(status=StepStatus.completed, result="approved by a person", finished_at=now),
            expect_status=(StepStatus.awaiting_approval,),
        )
        store.add_event(tenant, run_id, step.index, Event(text=with_reason("approved by a person", reason)))
        return store.update_run(tenant, run_id, RunChanges(status=RunStatus.queued), expect_status=(RunStatus.awaiting_approval,))
    store.update_step(
        tenant,
        run_id,
        step.index,
        StepChanges(status=StepStatus.failed, error=with_reason(REJECTED, reason), finished_at=now),
        expect_status=(StepStatus.awaiting_approval,),
    )
    store.add_event(tenant, run_id, step.index, Event(type=EventType.error, text=with_reason(REJECTED, reason)))
    store.update_run(
        tenant, run_id, RunChanges(error=with_reason(REJECTED, reason)), expect_status=(RunStatus.awaiting_approval,)
    )
    # The steps after it are skipped "rejected by a person" here: a run's end names that
    # reason only for an error that is those words alone, not one carrying a person's reason.
    skip_unrun_steps(svc, run, store.get_steps(tenant, run_id), REJECTED)
    return _close(svc, store.get_run(tenant, run_id, steps=False))
