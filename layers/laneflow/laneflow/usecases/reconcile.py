"""Reconcile (README, "Crash safety and reconcile"): find work whose worker went away and set it right.

1. Settle claim journal entries left pending by a crash (completed if the claim landed,
   else cancelled).
2. Mark interrupted the attempts whose worker is gone, each by its exact identity, and
   acknowledge each outcome: interrupted, already interrupted, continued, stale. An
   interrupted step runs again (it counts as a retry) or, out of retries, fails.
3. Re-drive `running` runs whose drive is gone; past `max_drives` (since the run's latest
   redrive, if a person redrove it), close them failed.
4. Re-drive queued runs nothing drives (an answered approval, a run never picked up).
5. Every run it closes goes through `end_run`, which tells the on-end hook, as if the run's
   own worker had ended it. A run it re-drove to completion that started a chained run
   (`then:`) where nothing else starts drives has that run driven by this same pass.
6. End runs whose stop was requested and whose drive is gone; close parked or queued ones.

A local runner that gets SIGINT or SIGTERM runs step 2 on itself before it goes
(`leave_drive`); `laneflow resume RUN` runs the whole pass for one run (`run_id`) and
re-drives it in that process.

Reads go through the store's active indexes only (running attempts, pending journal
entries, active runs): the cost grows with what is live, not with every run ever made.
A parked run is not polled: it waits until answered.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from laneflow.domain.chain import CHAIN_LIMIT
from laneflow.domain.errors import (
    AttemptEnded,
    Conflict,
    LaneflowError,
    NotFound,
    RecordDamaged,
)
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    FailureKind,
    ModelCall,
    Run,
    RunChanges,
    RunStatus,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redrive import drives_since_redrive
from laneflow.domain.workers import LocalProcess, WorkerRef
from laneflow.ports import Services
from laneflow.ports import WorkerLiveness as Liveness
from laneflow.usecases.end_run import close_run
from laneflow.usecases.run_step.inbox import expire_questions
from laneflow.usecases.stop import stop_run

log = logging.getLogger("laneflow.reconcile")


INTERRUPTED = "interrupted: its worker went away"

JOURNAL_GRACE_S = 60.0


@dataclass
class AttemptOutcome:
    tenant: str
    run_id: str
    index: int
    attempt: int
    outcome: str  # interrupted | already interrupted | continued | stale


@dataclass
class ReconcileReport:
    journal: list[tuple[str, str, str]] = field(default_factory=list)  # (run, op_id, settled status)
    attempts: list[AttemptOutcome] = field(default_factory=list)
    redriven: list[str] = field(default_factory=list)
    to_redrive: list[str] = field(default_factory=list)  # found, but this pass does not re-drive
    closed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # parked, not answered: left alone
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (run, why): unreadable, passed over
    prefixes: list[str] = field(default_factory=list)  # prefix claims released: their writer is gone

    def lines(self) -> list[str]:
        out = [f"journal: {run} {op} -> {status}" for run, op, status in self.journal]
        out += [f"attempt: {a.run_id} step {a.index} attempt {a.attempt}: {a.outcome}" for a in self.attempts]
        out += [f"re-driven: {r}" for r in self.redriven]
        out += [f"needs a re-drive: {r}" for r in self.to_redrive]
        out += [f"closed: {r}" for r in self.closed]
        out += [f"waiting for a person: {r}" for r in self.waiting]
        out += [f"passed over: {why}" for _, why in self.damaged]
        out += [f"prefix released: {p}" for p in self.prefixes]
        return out or ["nothing to reconcile"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "journal": [{"run_id": r, "op_id": o, "status": s} for r, o, s in self.journal],
            "attempts": [a.__dict__ for a in self.attempts],
            "redriven": self.redriven,
            "to_redrive": self.to_redrive,
            "closed": self.closed,
            "waiting": self.waiting,
            "damaged": [{"run_id": r, "why": why} for r, why in self.damaged],
            "prefixes": self.prefixes,
        }


def _age_s(stamp: str, now: _dt.datetime) -> float:
    return (now - _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


def drive_alive(liveness: Liveness, run: Run) -> bool:
    """Whether the run's drive may still be working: its driver is alive, or cannot be told
    (another host); a run with no driver has no drive."""
    return run.driver is not None and liveness.alive(run.driver) is not False


class Reconciler:
    def __init__(
        self,
        svc: Services,
        liveness: Liveness,
        *,
        redrive: Callable[[Run], None] | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        journal_grace_s: float = JOURNAL_GRACE_S,
    ):
        self.svc, self.store, self.liveness = svc, svc.store, liveness
        self.redrive, self.tenant, self.grace = redrive, tenant, journal_grace_s
        self.run_id = run_id  # set: this one run only (`laneflow resume`, a runner leaving)
        self.report = ReconcileReport()

    def _mine(self, run_id: str) -> bool:
        return self.run_id is None or run_id == self.run_id

    def run(self) -> ReconcileReport:
        self.settle_journal()
        self.interrupt_gone_attempts()
        self.release_gone_writers()
        self.drive_or_close_runs()
        return self.report

    # 1 -----------------------------------------------------------------------------------

    def _damaged(self, run_id: str, error: RecordDamaged) -> None:
        """A run whose record cannot be read is passed over (and said), never the end of
        the pass: the other runs are reconciled."""
        if all(r != run_id for r, _ in self.report.damaged):
            log.warning("reconcile passes over %s: %s", run_id, error)
            self.report.damaged.append((run_id, str(error)))

    def settle_journal(self) -> None:
        now = _dt.datetime.now(_dt.UTC)
        for entry in self.store.journal_pending(self.tenant):
            if not self._mine(entry.run_id):
                continue
            try:
                run = self.store.get_run(entry.tenant, entry.run_id, steps=False)
            except RecordDamaged as error:
                self._damaged(entry.run_id, error)
                continue
            driver_alive = self.liveness.alive(run.driver)
            if driver_alive and _age_s(entry.created_at, now) < self.grace:
                continue  # a live drive may be between asking and getting
            settled = self.store.journal_settle(entry.tenant, entry.run_id, entry.op_id)
            self.report.journal.append((entry.run_id, entry.op_id, str(settled.status)))

    # 2 -----------------------------------------------------------------------------------

    def interrupt_gone_attempts(self) -> None:
        for tenant, attempt in self.store.running_attempts(self.tenant):
            if not self._mine(attempt.run_id):
                continue
            try:
                run = self.store.get_run(tenant, attempt.run_id, steps=False)
            except RecordDamaged as error:
                self._damaged(attempt.run_id, error)
                continue
            worker = attempt.worker
            # Claimed but no worker written yet: it lives or dies with the run's drive.
            alive = self.liveness.alive(worker) if worker else self.liveness.alive(run.driver)
            if alive:
                self._ack(tenant, attempt, "continued")
                continue
            if alive is None and worker:
                self._ack(tenant, attempt, "continued")  # cannot tell (another host): leave it
                continue
            why = self.liveness.gone_for(worker)  # killed for memory, or evicted: its next attempt runs one size up
            reason, kind = (f"interrupted: {why}", FailureKind.memory) if why else (INTERRUPTED, None)
            self._ack(tenant, attempt, interrupt(self.svc, tenant, run, attempt, reason, kind=kind))

    def release_gone_writers(self) -> None:
        """A prefix claimed by an attempt that is no longer running (its worker went away, or
        it ended without releasing it) is released, and the steps waiting for it start."""
        from laneflow.usecases.prefix_gate import hand_back  # it builds on the step runner

        for tenant, record in self.store.list_writing_prefixes(self.tenant):
            writer = record.writer
            if writer is None or not self._mine(writer.run_id):
                continue
            if writer.n == 0 and record.writing(self.svc.cache_now()):
                continue  # claimed for a step's next attempt, which is about to be claimed
            try:
                attempt = self.store.get_attempt(tenant, writer.run_id, writer.index, writer.n)
                running = attempt.status == AttemptStatus.running
            except NotFound:
                running = False
            if running:
                continue
            handed = self.store.prefix_release(tenant, record.key, writer)
            hand_back(self.svc, handed, f"run {writer.run_id}'s writer is gone")
            self.report.prefixes.append(f"{record.key} (run {writer.run_id} step {writer.index}, {len(handed)} waiting)")

    def _ack(self, tenant: str, attempt: Attempt, outcome: str) -> None:
        self.report.attempts.append(AttemptOutcome(tenant, attempt.run_id, attempt.index, attempt.n, outcome))

    # 3, 4, 6 -----------------------------------------------------------------------------

    def drive_or_close_runs(self) -> None:
        for run in self.store.active_runs(self.tenant):
            if not self._mine(run.id):
                continue
            try:
                self._drive_or_close(run, self.svc.settings.max_drives)
            except RecordDamaged as error:  # its steps cannot be read: the next run's turn
                self._damaged(run.id, error)

    def _drive_or_close(self, run: Run, max_drives: int) -> None:
        driving = drive_alive(self.liveness, run)
        if run.status == RunStatus.awaiting_approval:
            if run.stop_requested:
                self._close_stopped(run)
            else:
                self.report.waiting.append(run.id)
            return
        if driving:
            return  # its drive is alive (and will see a stop at its next decision)
        if run.stop_requested:
            self._close_stopped(run)
        elif run.status == RunStatus.running and (drives := drives_since_redrive(run)) >= max_drives:
            close_run(
                self.svc,
                run.tenant,
                run.id,
                error="GaveUp",
                cause=f"its drive went away {drives} times (the limit is {max_drives} drives)",
            )
            self.report.closed.append(run.id)
        elif self.redrive is None:
            self.report.to_redrive.append(run.id)
        else:
            try:
                self.redrive(run)
                self.report.redriven.append(run.id)
            except Exception:  # one run's failure must not stop the pass
                log.exception("re-driving %s failed", run.id)
                return
            self._drive_chain(run)

    def _drive_chain(self, run: Run) -> None:
        """A run this pass re-drove that completed may have started its flow's chained run
        (`then:`). Where this deployment cannot start drives (`svc.drives` is None: the CLI's
        `laneflow reconcile`), that run was left queued: this pass drives it, and the run it
        chains to, rather than leaving them for the next reconcile. Where drives can be
        started (the cloud, `laneflow serve`), the run's end already started its drive."""
        if self.svc.drives is not None or self.redrive is None:
            return
        seen = {run.id}
        for _ in range(CHAIN_LIMIT):
            ended = self.store.get_run(run.tenant, run.id, steps=False, detail=False)
            chained_id = ended.then_run if ended.status == RunStatus.completed else None
            if chained_id is None or chained_id in seen:
                return
            seen.add(chained_id)
            chained = self.store.get_run(run.tenant, chained_id, steps=False, detail=False)
            if chained.status != RunStatus.queued or chained.drives or drive_alive(self.liveness, chained):
                return  # driven (or being driven) already
            try:
                self.redrive(chained)
                self.report.redriven.append(chained.id)
            except Exception:  # one run's failure must not stop the pass
                log.exception("driving %s, chained to %s, failed", chained.id, run.id)
                return
            run = chained

    def _close_stopped(self, run: Run) -> None:
        if run.status in (RunStatus.awaiting_approval, RunStatus.queued):
            stop_run(self.svc, run.tenant, run.id)
        else:
            close_run(self.svc, run.tenant, run.id, error="Stopped", cause="stopped by a person; its drive was gone")
        self.report.closed.append(run.id)


def interrupt(
    svc: Services,
    tenant: str,
    run: Run,
    attempt: Attempt,
    reason: str = INTERRUPTED,
    *,
    calls: list[ModelCall] | None = None,
    cost_usd: float | None = None,
    kind: FailureKind | None = None,
) -> str:
    """End a running attempt as interrupted, by its exact identity. Its step (or rescue) is
    resumed by the next drive and told why; an interruption is not the step's doing, so it
    spends none of its `retries:` (the run's drive limit bounds a worker that keeps dying).
    A stopped run's step ends failed instead. A worker that interrupts its own attempt (it is
    leaving) also passes what the attempt spent: its spans and the step's cost with them. A
    worker killed for memory or evicted gives its `kind` (memory): the next attempt runs one
    `size:` up (domain/sizes.py)."""
    store = svc.store
    fields: dict[str, Any]
    if run.stop_requested:
        fields = {"status": StepStatus.failed, "error": f"{reason}; the run was stopped", "finished_at": utcnow()}
    else:
        fields = {"status": StepStatus.pending, "error": reason}
    if cost_usd is not None:
        fields["cost_usd"] = cost_usd
    changes = StepChanges(**fields)
    try:
        ref = AttemptRef.of(tenant, attempt)
        store.end_attempt(ref, AttemptStatus.interrupted, reason=reason, step=changes, calls=calls, reason_kind=kind)
        expire_questions(svc, tenant, run.id, attempt.index, attempt.n)
        return "interrupted"
    except AttemptEnded:
        try:
            now = store.get_attempt(tenant, run.id, attempt.index, attempt.n)
        except NotFound:
            return "stale"
        return "already interrupted" if now.status == AttemptStatus.interrupted else "stale"


def reconcile(svc: Services, liveness: Liveness, **kwargs: Any) -> ReconcileReport:
    return Reconciler(svc, liveness, **kwargs).run()


# -- a local runner going away, and a person resuming one run -----------------------------------


def leave_drive(svc: Services, tenant: str, run_id: str, worker: WorkerRef, liveness: Liveness) -> Run:
    """A local runner got SIGINT or SIGTERM: it is a worker going away, not a failure. Its
    running attempts of the run (and those claimed with no worker yet, which live with its
    drive) are marked interrupted by exact identity, by reconcile's own step 2 told that
    this worker is gone while it is still alive; then, if it drives the run, the run keeps
    its status with no driver, so `laneflow resume` or the next reconcile re-drives it
    (completed steps carried). `liveness` is told that `worker` is gone. Safe to repeat."""
    Reconciler(svc, liveness, tenant=tenant, run_id=run_id).interrupt_gone_attempts()
    run = svc.store.get_run(tenant, run_id, steps=False)
    if not run.status.ended and run.driver == worker:
        try:
            run = svc.store.update_run(
                tenant, run_id, RunChanges(driver=None, execution=None), expect_status=(RunStatus.queued, RunStatus.running)
            )
        except Conflict:
            run = svc.store.get_run(tenant, run_id, steps=False)
    return run


class RunNotResumable(LaneflowError):
    """`resume` was asked for a run that has nothing to resume, or that a live drive holds."""

    exit_code = 2
    http_status = 409


def resumable_run(svc: Services, liveness: Liveness, tenant: str, run_id: str) -> Run:
    """The run, if a person may re-drive it now: not ended, not parked, and no drive of it
    alive (or that cannot be told dead) in another process. Raises `RunNotResumable` saying
    what to do instead."""
    run = svc.store.get_run(tenant, run_id, steps=False)
    if run.status.ended:
        raise RunNotResumable(f"run {run_id} has ended ({run.status}): there is nothing to resume")
    if run.status == RunStatus.awaiting_approval:
        raise RunNotResumable(
            f"run {run_id} is waiting for a person, not for a drive: answer it with laneflow approve {run_id} (or --reject)"
        )
    if drive_alive(liveness, run):
        driver = run.driver
        where = f"process {driver.pid} on {driver.host}" if isinstance(driver, LocalProcess) else "another worker"
        raise RunNotResumable(
            f"run {run_id} is still being driven by {where}: resume it once that drive has gone "
            f"(or end it with laneflow stop {run_id})"
        )
    return run
