"""NextDrive: the execution's history budget is spent, so the drive goes on in a fresh
execution of the same state machine (continue-as-new), and this one ends.

The fresh execution's name is derived from the run, the drive and its segment number
(`laneflow.domain.history.segment_name`), so a retried NextDrive starts the same execution,
never a second one. The run records it as what drives it before this execution ends:
reconcile then sees the newest execution, running, and leaves the run alone (an ended
older segment is not a drive gone away). A continuation is not a drive: `drives` (the
crash limit's count) stays as it is, and `segments` counts the continuations.
"""

from __future__ import annotations

from laneflow.domain.errors import Conflict, Unavailable
from laneflow.domain.history import segment_name
from laneflow.domain.messages import DriveContinued, ExecutionInput, NextDriveRequest
from laneflow.domain.records import RunChanges, RunStatus
from laneflow.domain.workers import StepFunctionsExecution, WorkerRef
from laneflow.ports import Services


def next_drive(svc: Services, req: NextDriveRequest) -> DriveContinued:
    """Start the drive's next segment (unless the run ended meanwhile) and record it."""
    tenant, run_id = req.run.tenant, req.run.run_id
    segment = req.run.segment + 1
    run = svc.store.get_run(tenant, run_id, steps=False)
    if run.status != RunStatus.running:
        return DriveContinued(run_id=run_id, execution=None, segment=req.run.segment)
    if svc.continuations is None:
        raise Unavailable("this deployment cannot start executions, so a drive cannot go on in a fresh one")
    name = segment_name(run_id, req.run.drive, segment)
    start = ExecutionInput(tenant=tenant, run_id=run_id, drive=req.run.drive, segment=segment)
    execution = svc.continuations.continue_drive(start, name)
    if run.execution != execution:  # a retried NextDrive has recorded it already
        driver: WorkerRef | None = (
            StepFunctionsExecution(execution=execution) if isinstance(run.driver, StepFunctionsExecution) else run.driver
        )
        try:
            svc.store.update_run(
                tenant,
                run_id,
                RunChanges(execution=execution, driver=driver, segments=run.segments + 1),
                expect_status=(RunStatus.running,),
            )
        except Conflict:
            pass  # ended meanwhile: the fresh execution's NextGroup ends too
    return DriveContinued(run_id=run_id, execution=execution, segment=segment)
