"""StepCrashed: the Catch of RunStep, for a worker that failed in a way its handler could
not record (a crash, a Lambda timeout)."""

from __future__ import annotations

from laneflow.domain.errors import AttemptEnded, Conflict
from laneflow.domain.messages import (
    StepCrashedReport,
    StepCrashedRequest,
)
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    EventType,
    FailureKind,
    Run,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redaction import scrub_paths
from laneflow.domain.sizes import attempt_size, one_up, run_sizes, task_overrides
from laneflow.domain.workers import FargateTask
from laneflow.ports import Services
from laneflow.usecases.run_step.message import earlier_attempts
from laneflow.usecases.wait_for_lead import open_gate


def step_crashed(svc: Services, req: StepCrashedRequest) -> StepCrashedReport:
    """The Catch of RunStep: its worker failed in a way the handler could not record (a
    crash, a Lambda timeout). End whatever attempt is still running, with the error's name,
    so the step is not left `running` with nothing working on it. A sandbox task stopped for
    memory or evicted below `large` leaves the step pending instead, and the report names
    the next size's task with `again`: the definition starts it (`_size_up`)."""
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
                    if req.size_up and (again := _size_up(svc, req, attempt, reason)) is not None:
                        return again
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
    return StepCrashedReport(index=index, status=step.status, attempts=step.attempts)


def _size_up(svc: Services, req: StepCrashedRequest, attempt: Attempt, reason: str) -> StepCrashedReport | None:
    """End an attempt whose sandbox task was stopped for memory (or evicted) as the runner
    ends one killed for memory: failed with the kind `memory`, its step back to pending, so
    the same execution starts a new task one size up (the attempt's, from the stored
    attempts, as the new worker finds it: sizes.attempt_size). None at `large` (the step
    fails as for any other crash) or for a stopped run."""
    store, tenant = svc.store, req.run.tenant
    run = store.get_run(tenant, req.run.run_id, steps=False, input=False)
    step = store.get_step(tenant, run.id, attempt.index)
    size = _attempt_size(svc, run, step.agent, step.started_at, attempt.index)
    up = one_up(size)
    if up is None or run.stop_requested:
        return None
    reason = f"{reason}; the next attempt runs at size {up}"
    try:
        store.end_attempt(
            AttemptRef.of(tenant, attempt),
            AttemptStatus.failed,
            reason=reason,
            step=StepChanges(status=StepStatus.pending, error=reason),
            reason_kind=FailureKind.memory,
        )
    except AttemptEnded:
        return None
    store.add_event(tenant, run.id, attempt.index, Event(type=EventType.error, text=reason))
    step = store.get_step(tenant, run.id, attempt.index)
    return StepCrashedReport(index=step.index, status=step.status, attempts=step.attempts, task=task_overrides(up), again=True)


def _attempt_size(svc: Services, run: Run, agent: str | None, since: str | None, index: int) -> str:
    """The size the step's running attempt ran at: its agent's, one up for every earlier
    attempt of its pass that ended for memory (as its worker found it)."""
    earlier = earlier_attempts(svc.store.list_attempts(run.tenant, run.id, index), since=since)
    return attempt_size(run_sizes(run.options).get(agent or ""), ((a.kind, a.reason) for a in earlier)).size


def _task_stopped_for(svc: Services, attempt: Attempt) -> str | None:
    """Why the attempt's sandbox task stopped, when ECS says it was for memory or an eviction
    (ecs.stopped_for): the record says so, and below `large` the step runs again one size up
    (`_size_up`; docs/CHOICES.md, "Size-up")."""
    if svc.tasks is None or not isinstance(attempt.worker, FargateTask):
        return None
    try:
        return svc.tasks.why_stopped(attempt.worker.task, attempt.worker.cluster)
    except Exception:  # cannot tell: the reason stays the error's
        return None
