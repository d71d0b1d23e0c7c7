"""StartDrive: claim a drive of a run (the first state of every execution)."""

from __future__ import annotations

from typing import Any

from laneflow.domain.errors import Conflict
from laneflow.domain.messages import (
    DriveRef,
    StartDriveRequest,
)
from laneflow.domain.records import (
    RunChanges,
    RunStatus,
    utcnow,
)
from laneflow.domain.settlement import (
    ACTIVE,
)
from laneflow.domain.workers import LambdaRequest, StepFunctionsExecution, WorkerRef
from laneflow.ports import Services


def start_drive(svc: Services, req: StartDriveRequest, worker: WorkerRef) -> DriveRef:
    """Claim a drive: the run becomes `running`, its drive count grows, `driven_at` is set
    at the first pick-up, and the run records what drives it (its execution in the cloud,
    the local process locally) so reconcile can tell when the drive is gone. A run that
    already ended is left as it is (NextGroup ends it)."""
    store = svc.store
    run = store.get_run(req.tenant, req.run_id, steps=False)
    if run.status not in ACTIVE:
        return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives, segment=req.segment)
    driver = StepFunctionsExecution(execution=req.execution) if isinstance(worker, LambdaRequest) else worker
    if req.input is not None and req.segment > 0:
        return _continue(svc, req, driver)
    first: dict[str, Any] = {"driven_at": utcnow()} if run.driven_at is None else {}
    changes = RunChanges(status=RunStatus.running, execution=req.execution or None, driver=driver, **first)
    try:
        run = store.update_run(req.tenant, req.run_id, changes, expect_status=ACTIVE, add_drives=1)
    except Conflict:
        run = store.get_run(req.tenant, req.run_id, steps=False)
    return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives)


def _continue(svc: Services, req: StartDriveRequest, driver: WorkerRef) -> DriveRef:
    """A continuation of a drive (NextDrive started it): the same drive goes on, so no drive
    is added (the crash limit counts drives, not executions); the run records this
    execution as what drives it now."""
    assert req.input is not None
    try:
        svc.store.update_run(
            req.tenant,
            req.run_id,
            RunChanges(execution=req.execution or None, driver=driver),
            expect_status=(RunStatus.running,),
        )
    except Conflict:
        pass  # the run ended or was parked meanwhile: NextGroup ends this execution
    return DriveRef(tenant=req.tenant, run_id=req.run_id, drive=req.input.drive, segment=req.segment)
