"""Redrive: a person sends a failed run on from where it failed (`laneflow redrive RUN`,
`POST /runs/{id}/redrive`). The rules are in laneflow.domain.redrive; this writes them.

One redrive wins: the run goes from `failed` to `queued` in one write conditional on its
status being `failed` (with its `redrives` grown by one, its error cleared and the redrive
kept in its options), so of two redrives at once the second is refused. Only then are its
failed and skipped flow steps set pending again (each conditionally, each with a trace line
saying so, which is also what its next attempt's message is built from), and its failed
rescue records superseded. The caller then starts the drive (`laneflow redrive` drives it
here; the API starts one with `svc.drives`, in the cloud a new execution of the state
machine). A crash between the run's write and the last step's leaves a queued run whose
next drive ends it failed again (a step still failed fails its group), and it can be
redriven again.
"""

from __future__ import annotations

from dataclasses import dataclass

from laneflow.domain.errors import Conflict
from laneflow.domain.records import Run, RunChanges, RunStatus, Step, StepChanges, StepStatus, utcnow
from laneflow.domain.redrive import REDRIVEN, SUPERSEDED_BY_REDRIVE, StepRedrive, plan, refusal
from laneflow.domain.workers import WorkerRef
from laneflow.ports import Services


class RunNotRedrivable(Conflict):
    """A redrive was asked for a run that has not failed, was stopped, has spent its budget,
    or that another redrive took first."""

    exit_code = 2
    http_status = 409


@dataclass(frozen=True)
class Redriven:
    """A run a redrive sent on (queued for its new drive), and how many steps run again."""

    run: Run
    steps: int


def redrive_run(svc: Services, tenant: str, run_id: str, *, driver: WorkerRef | None = None) -> Redriven:
    """Send a failed run on: its failed and skipped steps back to pending (each gets a new
    attempt, numbered after its old ones), its completed steps kept with their records and
    cost, the run `queued` with its error cleared and `redrives` grown by one. `driver` (who
    asks, when it is a worker reconcile can see alive) holds the run until its drive starts,
    so no reconcile drives it while its steps are being set pending. Raises
    `RunNotRedrivable` saying why not, `RunNotFound` when there is no such run."""
    store = svc.store
    run = store.get_run(tenant, run_id, steps=False)
    why = refusal(run)
    if why:
        raise RunNotRedrivable(why)
    steps = plan(store.get_steps(tenant, run_id, messages=False))
    if steps.running:
        first = steps.running[0]
        raise RunNotRedrivable(
            f"run {run_id} cannot be redriven yet: step {first.index} is still running (its attempt has not ended;"
            " a reconcile ends an attempt whose worker is gone)"
        )
    redrive = run.redrives + 1
    error = run.error or "no reason recorded"
    latest = {"n": redrive, "at": utcnow(), "error": error, "drives": run.drives}
    changes = RunChanges(
        status=RunStatus.queued,
        error=None,
        finished_at=None,
        redrives=redrive,
        driver=driver,
        options={**run.options, REDRIVEN: latest},
    )
    try:
        run = store.update_run(tenant, run_id, changes, expect_status=(RunStatus.failed,))
    except Conflict:
        now = store.get_run(tenant, run_id, steps=False)
        raise RunNotRedrivable(f"run {run_id} was redriven by another request first (it is {now.status} now)") from None
    for step in steps.reset:
        _reset(svc, run, step, StepRedrive(n=redrive, error=error, attempts=step.attempts, cycle=step.cycle))
    for rescue in steps.superseded:
        _supersede(svc, run, rescue)
    return Redriven(run=run, steps=len(steps.reset))


def _reset(svc: Services, run: Run, step: Step, redrive: StepRedrive) -> None:
    """A failed or skipped step back to pending, its own error and skip reason cleared (its
    attempts keep theirs), and the trace line its next attempt is told from."""
    try:
        svc.store.update_step(
            run.tenant,
            run.id,
            step.index,
            StepChanges(status=StepStatus.pending, error=None, skip_reason=None, finished_at=None),
            expect_status=(StepStatus.failed, StepStatus.skipped),
        )
    except Conflict:  # nothing else writes to a failed run's steps; its record says how it is
        return
    svc.store.add_event(run.tenant, run.id, step.index, redrive.event())


def _supersede(svc: Services, run: Run, rescue: Step) -> None:
    """A failed rescue record of a redriven step is history: skipped, so the step, should it
    fail again, gets its one rescue anew."""
    try:
        svc.store.update_step(
            run.tenant,
            run.id,
            rescue.index,
            StepChanges(status=StepStatus.skipped, skip_reason=SUPERSEDED_BY_REDRIVE),
            expect_status=(StepStatus.failed,),
        )
    except Conflict:
        pass
