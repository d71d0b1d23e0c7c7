"""Park: the drive reached an approval; the run waits for a person, holding no worker."""

from __future__ import annotations

from laneflow.domain.errors import Conflict
from laneflow.domain.messages import ParkRequest, RunEnded
from laneflow.domain.records import Event, RunChanges, RunStatus, StepChanges, StepStatus, utcnow
from laneflow.ports import Services
from laneflow.usecases.stop import _close


def park_run(svc: Services, req: ParkRequest) -> RunEnded:
    """The drive reached an approval: the run waits for a person, holding no worker."""
    store, tenant, run_id = svc.store, req.run.tenant, req.run.run_id
    for step in store.get_steps(tenant, run_id, group=req.group):
        if step.agent is None and step.status == StepStatus.pending:
            store.update_step(
                tenant, run_id, step.index, StepChanges(status=StepStatus.awaiting_approval), expect_status=(StepStatus.pending,)
            )
            store.add_event(tenant, run_id, step.index, Event(text=f"waiting for a person: {step.instruction}"))
    try:
        run = store.update_run(
            tenant,
            run_id,
            RunChanges(status=RunStatus.awaiting_approval, parked_at=utcnow(), execution=None, driver=None),
            expect_status=(RunStatus.running,),
        )
    except Conflict:
        run = store.get_run(tenant, run_id, steps=False)
    if store.get_run(tenant, run_id, steps=False).stop_requested:
        run = _close(svc, run)  # a stop came while parking: nothing stays parked
    svc.crashpoints.reached("parked")
    return RunEnded(run_id=run.id, status=run.status)
