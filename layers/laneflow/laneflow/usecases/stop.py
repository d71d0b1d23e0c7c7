"""What people do to runs: park at an approval, answer it, stop a run.

Stopping is one-way: `request_stop` is the only write of `stop_requested`, and no other save
names it. A run with a drive sees the stop at its next decision (and its running steps at
their next check); a run with no drive (parked, or queued) is closed here at once. Park and
stop each write, then read the other's write, so a stop racing a park never leaves a run
parked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from laneflow.domain.errors import Conflict
from laneflow.domain.messages import DriveRef, EndRunRequest
from laneflow.domain.records import Run, RunChanges, RunStatus
from laneflow.domain.settlement import STOPPED
from laneflow.domain.workers import FargateTask
from laneflow.ports import Services
from laneflow.usecases.end_run import end_run

log = logging.getLogger("laneflow.stop")

_NOT_ENDED = tuple(s for s in RunStatus if not s.ended)


def _close(svc: Services, run: Run) -> Run:
    end_run(svc, EndRunRequest(run=DriveRef(tenant=run.tenant, run_id=run.id)))
    return svc.store.get_run(run.tenant, run.id, steps=False)


@dataclass
class StopOutcome:
    run: Run
    message: str


def with_reason(what: str, reason: str | None) -> str:
    """What a person did, with the reason they gave ("stopped by a person: REASON")."""
    return f"{what}: {reason}" if reason else what


def stop_run(svc: Services, tenant: str, run_id: str, *, reason: str | None = None) -> StopOutcome:
    """Ask a run to stop. A run with no drive (parked or queued) is closed at once; a running
    one ends at its drive's next decision, its running steps at their next check. The
    person's `reason`, when given, is the run's error ("stopped by a person: REASON"): the
    first stop's, and only if nothing had failed it already."""
    store = svc.store
    run = store.get_run(tenant, run_id, steps=False)
    if run.status.ended:
        already = "already stopped" if run.stop_requested else "already ended"
        return StopOutcome(run, f"run {run_id} {already} ({run.status})")
    newly = store.request_stop(tenant, run_id)
    run = store.get_run(tenant, run_id, steps=False)
    if newly and reason and run.error is None and not run.status.ended:
        try:  # a run's end keeps the error it finds (a stop's own is STOPPED)
            run = store.update_run(tenant, run_id, RunChanges(error=with_reason(STOPPED, reason)), expect_status=_NOT_ENDED)
        except Conflict:  # it ended meanwhile: its own record says how
            run = store.get_run(tenant, run_id, steps=False)
    if run.status in (RunStatus.awaiting_approval, RunStatus.queued):
        run = _close(svc, run)
        return StopOutcome(run, f"run {run_id} stopped")
    if not newly:
        return StopOutcome(run, f"run {run_id} already stopped: it is ending")
    stopped = stop_sandbox_tasks(svc, tenant, run_id)
    tasks = f"; {stopped} sandbox task(s) told to stop" if stopped else ""
    return StopOutcome(run, f"run {run_id}: stop requested; its running steps end at their next check{tasks}")


def stop_sandbox_tasks(svc: Services, tenant: str, run_id: str) -> int:
    """Send StopTask to the Fargate task of each of the run's running attempts (a sandboxed
    step): its worker sees the stop as every worker does, and the task ends with it.
    Only attempts of this run, by what each names as its worker. How many were told."""
    if svc.tasks is None:
        return 0
    told = 0
    for _, attempt in svc.store.running_attempts(tenant):
        if attempt.run_id != run_id or not isinstance(attempt.worker, FargateTask):
            continue
        try:
            svc.tasks.stop(attempt.worker, f"laneflow: run {run_id} was stopped")
            told += 1
        except Exception as error:  # the worker still sees the stop itself
            log.warning("could not stop sandbox task %s: %s", attempt.worker.task, error)
    return told
