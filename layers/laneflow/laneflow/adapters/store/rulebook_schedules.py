"""The rule book's rules of schedules (laneflow.domain.schedules).

A schedule is one record with a version. Each change reads it, lets the domain decide
(`schedules.recorded`, `schedules.with_state`), and writes what it decided only if the
version is still the one it read; a write refused because another writer changed the record
meanwhile (two deliveries of a firing, a pause during a firing) is decided again on what the
record now holds. A started firing's run is kept under the schedule, apart from its record,
so every run a schedule started can be listed, not only those its record still names."""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable

from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.rulebook_base import RuleBase, _entry, _model
from laneflow.domain import schedules
from laneflow.domain.errors import Conflict, RecordDamaged, RunNotFound
from laneflow.domain.records import Run
from laneflow.domain.schedules import Firing, Outcome, Schedule, ScheduleNotFound, ScheduleState
from laneflow.domain.tenants import check_tenant

log = logging.getLogger("laneflow.store")

# A change decided again this many times because other writers kept changing the record is
# given up: a schedule is changed by a firing a minute at most, and by a person now and then.
TRIES = 50


def _parsed(rows: list[tuple[str, str]]) -> list[Schedule]:
    """The schedules of (id, record) rows, oldest first, leaving out (with a warning naming
    it) any that cannot be read."""
    found = []
    for schedule_id, doc in rows:
        try:
            found.append(_model(Schedule, doc, f"schedule {schedule_id!r}"))
        except RecordDamaged as damaged:
            log.warning("schedule %s left out: %s", schedule_id, damaged)
    return sorted(found, key=lambda s: (s.created_at, s.id))


class ScheduleRules(RuleBase):
    """The public methods of schedules."""

    def _schedule(self, tenant: str, schedule_id: str) -> Schedule:
        doc = self._read_schedule(tenant, schedule_id)
        if doc is None:
            raise ScheduleNotFound(schedule_id)
        return _model(Schedule, doc, f"schedule {schedule_id!r}")

    def _change_schedule(self, tenant: str, schedule_id: str, rule: Callable[[Schedule], Schedule]) -> Schedule:
        for _ in range(TRIES):
            current = self._schedule(tenant, schedule_id)
            changed = rule(current)
            try:
                self._write_schedule(changed, expected=current.version)
            except Refused:
                continue
            return changed
        raise Conflict(f"schedule {schedule_id!r} of tenant {tenant!r} kept changing under its writers")

    @_entry("schedule")
    def create_schedule(self, schedule: Schedule) -> None:
        check_tenant(schedule.tenant)
        try:
            self._write_schedule(schedule, expected=None)
        except Refused:
            raise Conflict(f"schedule {schedule.id!r} exists") from None

    @_entry()
    def get_schedule(self, tenant: str, schedule_id: str) -> Schedule:
        check_tenant(tenant)
        return self._schedule(tenant, schedule_id)

    @_entry()
    def list_schedules(self, tenant: str) -> list[Schedule]:
        check_tenant(tenant)
        return _parsed(self._schedule_docs(tenant, enabled_only=False))

    @_entry()
    def list_enabled_schedules(self, tenant: str | None = None) -> list[Schedule]:
        if tenant is not None:
            check_tenant(tenant)
        return [s for s in _parsed(self._schedule_docs(tenant, enabled_only=True)) if s.state == ScheduleState.enabled]

    @_entry("firing")
    def record_firing(self, tenant: str, schedule_id: str, firing: Firing, *, through: str | None = None) -> Schedule:
        check_tenant(tenant)
        if firing.outcome == Outcome.started:
            if not firing.run_id:
                raise ValueError("a started firing names its run")
            self._schedule(tenant, schedule_id)  # ScheduleNotFound before anything is kept
            self._put_schedule_run(tenant, schedule_id, firing.scheduled_at, firing.run_id)
        return self._change_schedule(tenant, schedule_id, lambda s: schedules.recorded(s, firing, through=through))

    @_entry()
    def set_schedule_state(self, tenant: str, schedule_id: str, state: ScheduleState, *, at: str) -> Schedule:
        check_tenant(tenant)
        now = _dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
        return self._change_schedule(tenant, schedule_id, lambda s: schedules.with_state(s, state, now))

    @_entry()
    def delete_schedule(self, tenant: str, schedule_id: str) -> Schedule:
        check_tenant(tenant)
        for _ in range(TRIES):
            current = self._schedule(tenant, schedule_id)
            try:
                self._delete_schedule(tenant, schedule_id, expected=current.version)
            except Refused:
                continue
            return current
        raise Conflict(f"schedule {schedule_id!r} of tenant {tenant!r} kept changing under its writers")

    @_entry()
    def list_schedule_runs(
        self, tenant: str, schedule_id: str, *, limit: int = 50, before: str | None = None
    ) -> list[tuple[str, Run]]:
        check_tenant(tenant)
        found = []
        for scheduled_at, run_id in self._schedule_runs(tenant, schedule_id, max(1, limit), before):
            try:
                found.append((scheduled_at, self.get_run(tenant, run_id, steps=False, detail=False)))
            except (RunNotFound, RecordDamaged):
                continue
        return found
