"""Firing schedules: one firing (what EventBridge Scheduler's target and `serve` do), every
schedule due at a time (`tick`: `serve`'s loop and `laneflow schedule tick`), and a firing
held by `buffer-one` once the run it waited for has ended.

Exactly one run per firing. A firing's run is made through the same start as the API's
(`start_run_idempotent.start_in`) with the idempotency key of (schedule, scheduled time)
(`schedules.firing_key`), so its id is fixed by them: a second delivery of the firing finds
the run the first made, starts nothing, and answers it. A firing recorded as skipped,
missed or failed is answered as recorded. Scheduler delivers at least once; this is what
makes that harmless.

Catch-up (`tick`): a schedule's firings since it was last looked at are `due`: the latest
fires if it is at most `catchup_s` old, the others are recorded missed.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from laneflow.domain.errors import LaneflowError, RunNotFound, TransientError
from laneflow.domain.records import Run
from laneflow.domain.schedules import (
    CATCHUP_S,
    SCHEDULE_ID,
    SCHEDULED_AT,
    Firing,
    Outcome,
    Schedule,
    ScheduleNotFound,
    ScheduleState,
    due,
    firing_key,
    overlap,
    scheduled_text,
)
from laneflow.ports import Services
from laneflow.usecases.start_run_idempotent import StartRun, idempotent_run_id, start_in

log = logging.getLogger("laneflow.schedules")


@dataclass(frozen=True)
class Fired:
    """What one firing did: as recorded (`firing`), with the run it started or found, and
    whether this delivery only found what an earlier one did (`replayed`)."""

    tenant: str
    schedule_id: str
    firing: Firing
    run: Run | None = None
    replayed: bool = False

    def line(self) -> str:
        f = self.firing
        said = f"{self.schedule_id} at {f.scheduled_at}: {f.outcome}"
        if f.run_id and f.outcome == Outcome.started:
            said += f" {f.run_id}" + (" (started before)" if self.replayed else "")
        if f.reason:
            said += f" ({f.reason})"
        return said

    def as_dict(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "schedule_id": self.schedule_id,
            "replayed": self.replayed,
            **self.firing.model_dump(mode="json"),
        }


def firing_run_id(tenant: str, schedule_id: str, scheduled_at: str) -> str:
    """The id of the run a firing starts (or started)."""
    return idempotent_run_id(tenant, firing_key(schedule_id, scheduled_text(scheduled_at)))


def _run(svc: Services, tenant: str, run_id: str | None) -> Run | None:
    if not run_id:
        return None
    try:
        return svc.store.get_run(tenant, run_id, steps=False, detail=False)
    except RunNotFound:
        return None


def fire(svc: Services, tenant: str, schedule_id: str, scheduled_at: str, *, through: str | None = None) -> Fired:
    """Fire the schedule's firing at `scheduled_at` once, whatever delivers it and however
    often. `ScheduleNotFound` for a schedule that is gone; a `TransientError` of the store
    is raised (the firing is delivered again); any other reason its run cannot be made is
    recorded (`failed`) and answered."""
    at = scheduled_text(scheduled_at)
    schedule = svc.store.get_schedule(tenant, schedule_id)
    key = firing_key(schedule.id, at)
    found = _run(svc, tenant, idempotent_run_id(tenant, key))
    earlier = schedule.firing(at)
    if found is not None:  # a second delivery: the run is there
        if earlier is not None and earlier.run_id == found.id and not _moves(schedule, through):
            return Fired(tenant, schedule.id, earlier, found, replayed=True)  # recorded already: nothing to write
        return _record(svc, schedule, Firing(scheduled_at=at, outcome=Outcome.started, run_id=found.id), found, True, through)
    if earlier is not None and earlier.outcome not in (Outcome.buffered, Outcome.started):
        if _moves(schedule, through):  # answered as recorded; how far a tick looked still moves on
            svc.store.record_firing(tenant, schedule.id, earlier, through=through)
        return Fired(tenant, schedule.id, earlier, replayed=True)
    if schedule.state != ScheduleState.enabled:
        return _record(
            svc, schedule, Firing(scheduled_at=at, outcome=Outcome.skipped, reason="the schedule is paused"), through=through
        )
    last = _run(svc, tenant, schedule.last_run)
    decision, why = overlap(
        schedule.overlap, last_run_active=last is not None and not last.status.ended, buffered=schedule.buffered, scheduled_at=at
    )
    if decision != "start":
        outcome = Outcome.buffered if decision == "buffer" else Outcome.skipped
        return _record(
            svc, schedule, Firing(scheduled_at=at, outcome=outcome, run_id=schedule.last_run, reason=why), through=through
        )
    request = StartRun(
        workspace=schedule.workspace, flow=schedule.flow, input=schedule.input, model=schedule.model, idempotency_key=key
    )
    try:
        started = start_in(
            svc, tenant, request, lambda: _where(svc, schedule), options={SCHEDULE_ID: schedule.id, SCHEDULED_AT: at}
        )
    except TransientError:
        raise
    except LaneflowError as error:  # the flow, its input, the workspace: the firing records why
        reason = svc.redactor(str(error).splitlines()[0])
        log.warning("schedule %s: the firing at %s did not start a run: %s", schedule.id, at, reason)
        return _record(svc, schedule, Firing(scheduled_at=at, outcome=Outcome.failed, reason=reason), through=through)
    firing = Firing(scheduled_at=at, outcome=Outcome.started, run_id=started.run.id)
    return _record(svc, schedule, firing, started.run, started.replayed, through)


def delivered(svc: Services, tenant: str, schedule_id: str, scheduled_at: str) -> dict[str, object]:
    """A firing as EventBridge Scheduler delivers it (the fire function): fired once, and
    answered. A schedule removed while Scheduler was delivering its firing is answered
    `gone` (not an error: Scheduler would retry it into the dead-letter queue)."""
    try:
        return fire(svc, tenant, schedule_id, scheduled_at).as_dict()
    except ScheduleNotFound:
        log.warning("schedule %s of tenant %s is gone; its firing at %s starts nothing", schedule_id, tenant, scheduled_at)
        return {"tenant": tenant, "schedule_id": schedule_id, "scheduled_at": scheduled_text(scheduled_at), "outcome": "gone"}


def _moves(schedule: Schedule, through: str | None) -> bool:
    """Whether recording with `through` would move how far the schedule was looked at."""
    return through is not None and (schedule.through is None or through > schedule.through)


def _where(svc: Services, schedule: Schedule) -> str:
    if schedule.workspace_uri:
        return schedule.workspace_uri
    if svc.workspaces is None:
        raise LaneflowError("this deployment has no workspaces to run schedules from")
    return svc.workspaces.locate(schedule.tenant, schedule.workspace)


def _record(
    svc: Services, schedule: Schedule, firing: Firing, run: Run | None = None, replayed: bool = False, through: str | None = None
) -> Fired:
    written = svc.store.record_firing(schedule.tenant, schedule.id, firing, through=through)
    return Fired(schedule.tenant, schedule.id, written.firing(firing.scheduled_at) or firing, run, replayed)


def tick(svc: Services, now: dt.datetime, *, catchup_s: float = CATCHUP_S, tenant: str | None = None) -> list[Fired]:
    """Fire what is due at `now` for every enabled schedule (of one tenant, or all): per
    schedule at most one firing, the latest, if it is at most `catchup_s` old; the others
    since it was last looked at are recorded missed. Then a firing `buffer-one` holds fires
    if the run it waited for has ended. One schedule's failure does not stop the others'."""
    fired: list[Fired] = []
    for schedule in svc.store.list_enabled_schedules(tenant):
        try:
            fired += _tick_one(svc, schedule, now, catchup_s)
        except TransientError:
            raise
        except LaneflowError as error:  # gone meanwhile, or its record cannot be read
            log.warning("schedule %s was not fired: %s", schedule.id, error)
    return fired


def _tick_one(svc: Services, schedule: Schedule, now: dt.datetime, catchup_s: float) -> list[Fired]:
    found = due(schedule, now, catchup_s=catchup_s)
    fired: list[Fired] = []
    for at in reversed([at for at in found.missed if schedule.firing(at) is None]):  # oldest first; none recorded twice
        why = f"nothing fired it in time (more than {catchup_s:g} s passed before laneflow looked)"
        fired.append(_record(svc, schedule, Firing(scheduled_at=at, outcome=Outcome.missed, reason=why), through=found.through))
    if found.fire is not None:
        fired.append(fire(svc, schedule.tenant, schedule.id, found.fire, through=found.through))
    held = fire_held(svc, schedule.tenant, schedule.id)
    return fired + ([held] if held else [])


def fire_held(svc: Services, tenant: str, schedule_id: str) -> Fired | None:
    """Start the firing `buffer-one` holds, if the run it waited for has ended (None: none
    held, or that run still active)."""
    schedule = svc.store.get_schedule(tenant, schedule_id)
    if schedule.buffered is None:
        return None
    last = _run(svc, tenant, schedule.last_run)
    if last is not None and not last.status.ended:
        return None
    return fire(svc, tenant, schedule_id, schedule.buffered)


def after_run_ended(svc: Services, run: Run) -> None:
    """A run a schedule started has ended: the firing held for it starts now (EndRun calls
    this; `tick` would, on its next look)."""
    if run.schedule_id is None:
        return
    try:
        fire_held(svc, run.tenant, run.schedule_id)
    except LaneflowError as error:  # the run has ended; what its schedule holds fires on the next look
        log.warning("schedule %s: the held firing did not start after %s ended: %s", run.schedule_id, run.id, error)
