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
        return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives)
    driver = StepFunctionsExecution(execution=req.execution) if isinstance(worker, LambdaRequest) else worker
    first: dict[str, Any] = {"driven_at": utcnow()} if run.driven_at is None else {}
    changes = RunChanges(status=RunStatus.running, execution=req.execution or None, driver=driver, **first)
    try:
        run = store.update_run(req.tenant, req.run_id, changes, expect_status=ACTIVE, add_drives=1)
    except Conflict:
        run = store.get_run(req.tenant, req.run_id, steps=False)
    return DriveRef(tenant=run.tenant, run_id=run.id, drive=run.drives)
