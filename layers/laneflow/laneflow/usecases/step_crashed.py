"""StepCrashed: the Catch of RunStep, for a worker that failed in a way its handler could
not record (a crash, a Lambda timeout)."""

from __future__ import annotations

from laneflow.domain.errors import AttemptEnded, Conflict
from laneflow.domain.messages import (
    StepCrashedRequest,
    StepReport,
)
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    EventType,
    FailureKind,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redaction import scrub_paths
from laneflow.domain.workers import FargateTask
from laneflow.ports import Services
from laneflow.usecases.wait_for_lead import open_gate


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
                if why := _task_stopped_for(svc, attempt):  # its sandbox task was killed for memory, or evicted
                    reason = f"{reason}; {why}"
                try:
                    store.end_attempt(
                        AttemptRef.of(tenant, attempt),
                        AttemptStatus.failed,
                        reason=reason,
                        step=StepChanges(status=StepStatus.failed, error=reason, finished_at=utcnow()),
                        reason_kind=FailureKind.memory if why else FailureKind.worker,
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
                StepChanges(status=StepStatus.failed, error=reason, finished_at=utcnow()),
                expect_status=(StepStatus.pending, StepStatus.running),
            )
        except Conflict:
            step = store.get_step(tenant, run_id, index)
    store.add_event(tenant, run_id, index, Event(type=EventType.error, text=reason))
    if req.step.role == "lead":
        open_gate(
            svc,
            tenant,
            run_id,
            group=req.group,
            cycle=req.cycle,
            lane=req.lane,
            lead=index,
            why="the lead's worker failed",
            lead_ended=True,
        )
    return StepReport(index=index, status=step.status, attempts=step.attempts)


def _task_stopped_for(svc: Services, attempt: Attempt) -> str | None:
    """Why the attempt's sandbox task stopped, when ECS says it was for memory or an eviction
    (ecs.stopped_for): the record says so. The step still fails here, as for any worker that
    died in its execution (docs/CHOICES.md, "The sandbox worker")."""
    if svc.tasks is None or not isinstance(attempt.worker, FargateTask):
        return None
    try:
        return svc.tasks.why_stopped(attempt.worker.task, attempt.worker.cluster)
    except Exception:  # cannot tell: the reason stays the error's
        return None
