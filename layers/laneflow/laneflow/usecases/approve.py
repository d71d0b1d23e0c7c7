"""A person answers a parked run's approval: approve (queued for a new drive) or reject."""

from __future__ import annotations

from laneflow.domain.errors import LaneflowError
from laneflow.domain.records import Event, EventType, Run, RunChanges, RunStatus, StepChanges, StepStatus, utcnow
from laneflow.domain.settlement import REJECTED
from laneflow.ports import Services
from laneflow.usecases.stop import _close


class RunNotWaiting(LaneflowError):
    """An approval was answered for a run that is not waiting for one."""

    exit_code = 2
    http_status = 409


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
            tenant,
            run_id,
            step.index,
            StepChanges(status=StepStatus.completed, result="approved by a person", finished_at=now),
            expect_status=(StepStatus.awaiting_approval,),
        )
        store.add_event(tenant, run_id, step.index, Event(text="approved by a person"))
        return store.update_run(tenant, run_id, RunChanges(status=RunStatus.queued), expect_status=(RunStatus.awaiting_approval,))
    store.update_step(
        tenant,
        run_id,
        step.index,
        StepChanges(status=StepStatus.failed, error=REJECTED, finished_at=now),
        expect_status=(StepStatus.awaiting_approval,),
    )
    store.add_event(tenant, run_id, step.index, Event(type=EventType.error, text=REJECTED))
    # The steps after it are skipped ("rejected by a person") where every run's end skips them.
    store.update_run(tenant, run_id, RunChanges(error=REJECTED), expect_status=(RunStatus.awaiting_approval,))
    return _close(svc, store.get_run(tenant, run_id, steps=False))
