"""The embedded store's schedules: their primitives over the `schedules` table (one row per
tenant and schedule, the record as JSON, its version the condition of every write) and the
`schedule_runs` table (the run each started firing made)."""

from __future__ import annotations

from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.sqlite_db import SqliteDatabase
from laneflow.domain.schedules import Schedule, ScheduleState


class SqliteSchedules(SqliteDatabase):
    """The primitives of schedules."""

    def _read_schedule(self, tenant: str, schedule_id: str) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT record FROM schedules WHERE tenant = ? AND id = ?", (tenant, schedule_id)).fetchone()
        return None if row is None else str(row[0])

    def _schedule_docs(self, tenant: str | None, *, enabled_only: bool) -> list[tuple[str, str]]:
        where, args = ["enabled = 1"] if enabled_only else [], []
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        sql = "SELECT id, record FROM schedules" + (f" WHERE {' AND '.join(where)}" if where else "")
        with self._read() as db:
            return [(str(i), str(record)) for i, record in db.execute(sql, args).fetchall()]

    def _write_schedule(self, schedule: Schedule, *, expected: int | None) -> None:
        body, enabled = schedule.model_dump_json(), int(schedule.state == ScheduleState.enabled)
        with self._write() as db:
            if expected is None:
                done = db.execute(
                    "INSERT OR IGNORE INTO schedules (tenant, id, version, enabled, record) VALUES (?, ?, ?, ?, ?)",
                    (schedule.tenant, schedule.id, schedule.version, enabled, body),
                ).rowcount
            else:
                done = db.execute(
                    "UPDATE schedules SET version = ?, enabled = ?, record = ? WHERE tenant = ? AND id = ? AND version = ?",
                    (schedule.version, enabled, body, schedule.tenant, schedule.id, expected),
                ).rowcount
            if not done:
                raise Refused()

    def _delete_schedule(self, tenant: str, schedule_id: str, *, expected: int) -> None:
        with self._write() as db:
            done = db.execute(
                "DELETE FROM schedules WHERE tenant = ? AND id = ? AND version = ?", (tenant, schedule_id, expected)
            ).rowcount
            if not done:
                raise Refused()

    def _put_schedule_run(self, tenant: str, schedule_id: str, scheduled_at: str, run_id: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO schedule_runs (tenant, schedule_id, scheduled_at, run_id) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, schedule_id, scheduled_at) DO UPDATE SET run_id = excluded.run_id",
                (tenant, schedule_id, scheduled_at, run_id),
            )

    def _schedule_runs(self, tenant: str, schedule_id: str, limit: int, before: str | None) -> list[tuple[str, str]]:
        older, args = ("", ()) if before is None else (" AND scheduled_at < ?", (before,))
        with self._read() as db:
            rows = db.execute(
                f"SELECT scheduled_at, run_id FROM schedule_runs WHERE tenant = ? AND schedule_id = ?{older}"
                " ORDER BY scheduled_at DESC LIMIT ?",
                (tenant, schedule_id, *args, limit),
            ).fetchall()
        return [(str(at), str(run_id)) for at, run_id in rows]
