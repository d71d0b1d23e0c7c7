"""The embedded store: one SQLite database file (stdlib `sqlite3`).

Tables (every key starts with the tenant; `idx` is a step's index, `n` an attempt number):

    runs           (tenant, id) PK. The Run's scalar fields as columns; `input`, `options`
                   and `flow_spec` as JSON text; `workspace_uri`. Indexed by
                   (tenant, created_at DESC) for `list_runs`. A run id is unique within its
                   tenant; another tenant's run of the same id is a different run.
    steps          (tenant, run_id, idx) PK. The Step's scalar fields as columns (`group` is
                   `grp`); `item` and `data` as JSON text.
    attempts       (tenant, run_id, idx, n) PK. token, started_at, resumed_at, status,
                   ended_at, reason, reason_kind, worker, heartbeat_at, op_id. A partial unique index allows at most
                   one `running` attempt per step, so even a bug cannot run a step twice.
    events         seq INTEGER PRIMARY KEY AUTOINCREMENT (the order of a step's trace);
                   tenant, run_id, idx, t, type, text, attempt, data (JSON or NULL).
                   Indexed by (tenant, run_id, idx, seq).
    calls          (tenant, run_id, idx, id) PK; n; body = the ModelCall as JSON. Read by n.
    prompt_layers  (tenant, run_id, idx) PK; layers = JSON list of PromptLayer.
    notes          (tenant, run_id, id) PK; to_idx, status (a question's), body = the Note
                   as JSON. A partial index on status 'open' lists the open questions.
    observed       seq PK (the order observed); tenant, run_id, idx, n, id: a note an
                   attempt has observed (peers, ask).

Events, spans and layers are rows of their own, never a growing column (a DynamoDB
item stops at 400 KB, and both stores keep one shape).

Reading. Each query has SQLite render its rows as the model's JSON (`json_object`), the
children are grouped by step in Python, and pydantic validates the assembled JSON in one
call. A run is one query per table, so a 1,000-step run with 5 events, a span and layers
per step reads in ~40 ms on a busy 2-core machine (building dicts in Python and validating
those took ~55 ms; validation alone is ~20-25 ms of either).

Concurrency. The file is in WAL mode (readers never block the writer), `synchronous=NORMAL`
and `busy_timeout` 10 s (another process - a second terminal's `stop` - waits its turn
instead of failing). Every write is one `BEGIN IMMEDIATE` transaction: the write lock is
taken before the first read, so a read-check-write (a status condition, an attempt fence)
cannot interleave with another writer, and any error rolls the whole write back. The rules
(laneflow.adapters.store.rulebook) read what a claim or a journal entry depends on, decide,
and hand this store a conditional write, which re-checks its condition inside its own
transaction and is refused if it no longer holds. A lock still held by another connection
past the busy timeout is `TransientError` (the state machine retries it by name).

Within one process every call goes through ONE connection behind a lock. Measured on this
project's workload (claim, worker, 20 fenced events, a span and end_attempt per step, on a
2-core machine): from 32 threads one locked connection did ~12,600 writes/s, a connection
per thread ~6,900, and per-thread connections with a process write lock ~8,300 (64 threads:
10,300 / 8,700 / 9,200; 1-4 threads: within noise of each other). Writers on separate
connections contend through SQLite's busy handler, which sleeps (1, 2, 5 ... ms) instead of
queueing, while a Python lock hands over in microseconds. With reads mixed in, all three
were within noise (the GIL, converting rows, is then the limit), so parallel readers buy
nothing here. One connection also makes `sqlite:///:memory:` work and needs no per-thread
connection bookkeeping for the engine's short-lived threads.

Floats: costs are rounded to 6 decimals whenever they are stored, so sums of many small
costs do not show binary drift (0.1 + 0.2 is stored as 0.3).

Modules: this one (runs, steps, attempts, the journal and the trace: their primitives),
sqlite_inbox.py (handoffs, warm gates, inboxes), sqlite_schedules.py (schedules), sqlite_db.py (the connection, transactions,
rows read as JSON), sqlite_schema.py (tables, columns, migrations, the SQL that renders rows
as JSON).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from pydantic import TypeAdapter

from laneflow.adapters.store.encoding import COST_DECIMALS, dumps, worker_text
from laneflow.adapters.store.primitives import AttemptWrite, Claim, Doc, Refused, RunPart, StepState
from laneflow.adapters.store.rulebook import RuleBookStore
from laneflow.adapters.store.rulebook_base import ACTIVE
from laneflow.adapters.store.sqlite_inbox import SqliteGatesAndInboxes
from laneflow.adapters.store.sqlite_prefixes import SqlitePrefixes
from laneflow.adapters.store.sqlite_schedules import SqliteSchedules
from laneflow.adapters.store.sqlite_schema import (
    ATTEMPT_JSON,
    RUN_COLUMNS,
    RUN_JSON,
    STEP_COLUMNS,
    array,
    columns_of,
    splice,
    to_db,
)
from laneflow.domain.errors import RecordDamaged
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.records import (
    READ_JSON,
    Attempt,
    AttemptRef,
    Event,
    JournalEntry,
    JournalStatus,
    PromptLayer,
    Run,
    Step,
)

log = logging.getLogger("laneflow.store")

_ATTEMPTS = TypeAdapter(list[Attempt], config=READ_JSON)

_ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)

_UPSERT_CALL = (
    "INSERT INTO calls (tenant, run_id, idx, id, n, body) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (tenant, run_id, idx, id) DO UPDATE SET n = excluded.n, body = excluded.body"
)

_UPSERT_LAYERS = (
    "INSERT INTO prompt_layers (tenant, run_id, idx, layers) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (tenant, run_id, idx) DO UPDATE SET layers = excluded.layers"
)

_INSERT_EVENT = "INSERT INTO events (tenant, run_id, idx, t, type, text, attempt, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def _layers(layers: list[PromptLayer]) -> str:
    return dumps([layer.model_dump() for layer in layers])


def _event_row(tenant: str, run_id: str, index: int, event: Event) -> tuple[Any, ...]:
    return (
        tenant,
        run_id,
        index,
        event.t,
        event.type,
        event.text,
        event.attempt,
        None if event.data is None else dumps(event.data),
    )


class SqliteStore(SqliteGatesAndInboxes, SqlitePrefixes, SqliteSchedules, RuleBookStore):
    """The embedded store (see the module docstring for tables and concurrency).
    `busy_timeout_s`: how long a write waits for another connection's lock before it is a
    `TransientError`."""

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    # == primitives: reads ==============================================================

    def _read_run(
        self, tenant: str, run_id: str, *, steps: bool = False, detail: bool = False, part: RunPart = "whole"
    ) -> Doc | None:
        with self._read() as db:
            if part == "key":
                found = db.execute("SELECT 1 FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
                return None if found is None else {}
            run = self._run_json(db, tenant, run_id, part=part)
            if run is None or part == "input":
                return run
            step_list = [doc for _, doc in self._steps_json(db, tenant, run_id, detail=detail)] if steps else []
        return splice(run, steps=array(step_list))

    def _read_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        index: int | None = None,
        group: int | None = None,
        detail: bool = False,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[tuple[int, Doc]]:
        with self._read() as db:
            return self._steps_json(  # type: ignore[return-value]
                db,
                tenant,
                run_id,
                index=index,
                group=group,
                detail=detail,
                messages=messages,
                filtered=where,
            )

    def _read_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        """Counted in SQL: one row per group leaves the database, not one per step."""
        flow, rescue = "rescue_of IS NULL", "rescue_of IS NOT NULL"
        with self._read() as db:
            rows = db.execute(
                f"SELECT grp, COALESCE(MAX(CASE WHEN {flow} THEN cycle END), 0),"
                f" SUM({flow} AND status IN ('pending', 'awaiting-approval')),"
                f" SUM({flow} AND status = 'failed' AND optional = 0),"
                f" SUM({rescue} AND status IN ('pending', 'running')),"
                " SUM(cost_usd), MAX(idx),"
                f" SUM({flow} AND status IN ('pending', 'running')),"
                " SUM(status IN ('pending', 'awaiting-approval')), SUM(savings_usd)"
                " FROM steps WHERE tenant = ? AND run_id = ? GROUP BY grp ORDER BY grp",
                (tenant, run_id),
            ).fetchall()
        return [
            GroupOutline(
                group=g,
                cycle=c,
                pending=p,
                failed_required=f,
                unfinished_rescues=u,
                cost_usd=round(cu or 0.0, 6),
                last_index=last,
                unfinished=n,
                waiting=w,
                savings_usd=round(su or 0.0, 6),
            )
            for g, c, p, f, u, cu, last, n, w, su in rows
        ]

    def _read_attempts(self, tenant: str, run_id: str, *, index: int | None = None, n: int | None = None) -> list[Attempt] | None:
        args: list[str | int]
        sql, args = f"SELECT {ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ?", [tenant, run_id]
        if index is not None:
            sql, args = sql + " AND idx = ?", args + [index]
        if n is not None:
            sql, args = sql + " AND n = ?", args + [n]
        with self._read() as db:
            rows = db.execute(sql + " ORDER BY idx, n", args).fetchall()
            if not rows and db.execute("SELECT 1 FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone() is None:
                return None
        return _ATTEMPTS.validate_json(array([a for (a,) in rows]))

    def _read_step_state(self, tenant: str, run_id: str, index: int | None, op_id: str | None) -> StepState | None:
        with self._read() as db:
            entry = self._journal_row(db, tenant, run_id, op_id) if op_id is not None else None
            if index is None:
                if entry is None:
                    return None
                index = entry.index
            row = db.execute(
                "SELECT status, attempts FROM steps WHERE tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, index)
            ).fetchone()
            if row is None:
                return None
            running, last_n = db.execute(
                "SELECT max(CASE WHEN status = 'running' THEN n END), max(n) FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ?",
                (tenant, run_id, index),
            ).fetchone()
            landed = None
            if op_id is not None:
                # An op_id names one step, so its attempts are searched among that step's (by
                # the key), not the run's: a scan of the run's attempts made every claim of a
                # 10,000-step run slower than the one before.
                got = db.execute(
                    f"SELECT {ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ? AND op_id = ? ORDER BY n LIMIT 1",
                    (tenant, run_id, index, op_id),
                ).fetchone()
                landed = None if got is None else Attempt.model_validate_json(got[0])
        return StepState(
            index=index, status=row[0], attempts=row[1], last_n=last_n or 0, running=running, entry=entry, landed=landed
        )

    def _list_runs(
        self, tenant: str, limit: int, statuses: list[str] | None, before: str | None = None
    ) -> list[tuple[str, Doc | RecordDamaged]] | None:
        sql, args = f"SELECT tenant, id, {RUN_JSON} FROM runs WHERE tenant = ?", [tenant]
        if statuses is not None:
            sql, args = sql + f" AND status IN ({', '.join('?' * len(statuses))})", args + statuses
        with self._read() as db:
            if before is not None:  # after that run in the order below: (created_at, rowid) less than its
                at = db.execute("SELECT created_at, rowid FROM runs WHERE tenant = ? AND id = ?", (tenant, before)).fetchone()
                if at is None:
                    return None
                sql, args = sql + " AND (created_at < ? OR (created_at = ? AND rowid < ?))", [*args, at[0], at[0], at[1]]
            # rowid breaks ties between runs created in the same millisecond: later insert first.
            sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
            return self._runs(db, db.execute(sql, [*args, limit]).fetchall())

    def _active_runs(self, tenant: str | None) -> list[tuple[str, Doc | RecordDamaged]]:
        query = f"SELECT tenant, id, {RUN_JSON} FROM runs WHERE status IN ({_ACTIVE_SQL})"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query, args = query + " AND tenant = ?", (tenant,)
        with self._read() as db:
            return self._runs(db, db.execute(query + " ORDER BY created_at", args).fetchall())

    def _running_attempts(self, tenant: str | None) -> list[tuple[str, Attempt]]:
        query = f"SELECT tenant, {ATTEMPT_JSON} FROM attempts WHERE status = 'running'"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query, args = query + " AND tenant = ?", (tenant,)
        with self._read() as db:
            rows = db.execute(query, args).fetchall()
        return [(row[0], Attempt.model_validate_json(row[1])) for row in rows]

    def _pending_entries(self, tenant: str | None) -> list[JournalEntry]:
        query = "SELECT tenant, run_id, op_id FROM journal WHERE status = 'pending'"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query, args = query + " AND tenant = ?", (tenant,)
        with self._read() as db:
            keys = db.execute(query, args).fetchall()
            return [e for k in keys if (e := self._journal_row(db, *k)) is not None]

    # == primitives: writes =============================================================

    def _insert_run(self, run: Run) -> None:
        columns = ", ".join(c for c, _ in RUN_COLUMNS.values())
        marks = ", ".join("?" * len(RUN_COLUMNS))
        values = tuple(to_db(kind, getattr(run, f)) for f, (_, kind) in RUN_COLUMNS.items())
        with self._write() as db:
            try:
                db.execute(f"INSERT INTO runs ({columns}) VALUES ({marks})", values)
            except sqlite3.IntegrityError:
                raise Refused() from None
            self._put_steps(db, run.tenant, run.id, run.steps)

    def _insert_steps(self, tenant: str, run_id: str, steps: list[Step]) -> bool:
        with self._write() as db:
            if db.execute("SELECT 1 FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone() is None:
                return False
            self._put_steps(db, tenant, run_id, steps)
            return True

    @staticmethod
    def _put_steps(db: sqlite3.Connection, tenant: str, run_id: str, steps: list[Step]) -> None:
        """Insert step rows, with whatever events, calls and layers the records carry."""
        columns = ", ".join(["tenant", "run_id"] + [c for c, _ in STEP_COLUMNS.values()])
        marks = ", ".join("?" * (len(STEP_COLUMNS) + 2))
        rows, events, calls, layers = [], [], [], []
        for step in steps:
            rows.append((tenant, run_id, *(to_db(kind, getattr(step, f)) for f, (_, kind) in STEP_COLUMNS.items())))
            events += [_event_row(tenant, run_id, step.index, e) for e in step.events]
            calls += [(tenant, run_id, step.index, c.id, c.n, c.model_dump_json()) for c in step.calls]
            if step.prompt_layers:
                layers.append((tenant, run_id, step.index, _layers(step.prompt_layers)))
        try:
            db.executemany(f"INSERT INTO steps ({columns}) VALUES ({marks})", rows)
        except sqlite3.IntegrityError:
            raise Refused() from None
        db.executemany(_INSERT_EVENT, events)
        db.executemany("INSERT OR REPLACE INTO calls (tenant, run_id, idx, id, n, body) VALUES (?, ?, ?, ?, ?, ?)", calls)
        db.executemany("INSERT INTO prompt_layers (tenant, run_id, idx, layers) VALUES (?, ?, ?, ?)", layers)

    def _update_run(
        self,
        tenant: str,
        run_id: str,
        values: dict[str, Any],
        *,
        expected: list[str] | None,
        add_drives: int = 0,
        unset: str | None = None,
    ) -> Doc:
        sets = {column: ("?", value) for column, value in columns_of(Run, values).items()}
        if add_drives:
            sets["drives"] = ("drives + ?", add_drives)
        flag = "0" if unset is None else RUN_COLUMNS[unset][0]
        with self._write() as db:
            found = db.execute(f"SELECT status, {flag} FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
            if found is None or (expected is not None and found[0] not in expected) or found[1]:
                raise Refused(found and found[0])
            db.execute(
                f"UPDATE runs SET {', '.join(f'{c} = {expr}' for c, (expr, _) in sets.items())} WHERE tenant = ? AND id = ?",
                (*(arg for _, arg in sets.values()), tenant, run_id),
            )
            return self._run_json(db, tenant, run_id)  # type: ignore[return-value]

    def _add_run_cost(self, tenant: str, run_id: str, usd: float, *, expected: list[str]) -> float:
        with self._write() as db:
            found = db.execute("SELECT status FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
            if found is None or found[0] not in expected:
                raise Refused(found and found[0])
            db.execute(
                f"UPDATE runs SET cost_usd = ROUND(cost_usd + ?, {COST_DECIMALS}) WHERE tenant = ? AND id = ?",
                (usd, tenant, run_id),
            )
            return float(db.execute("SELECT cost_usd FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()[0])

    def _update_step(self, tenant: str, run_id: str, index: int, values: dict[str, Any], *, expected: list[str] | None) -> Doc:
        key = (tenant, run_id, index)
        with self._write() as db:
            found = db.execute("SELECT status FROM steps WHERE tenant = ? AND run_id = ? AND idx = ?", key).fetchone()
            if found is None or (expected is not None and found[0] not in expected):
                raise Refused(found and found[0])
            self._set_step(db, *key, columns_of(Step, values))
            return self._steps_json(db, *key[:2], index=index)[0][1]

    @staticmethod
    def _set_step(db: sqlite3.Connection, tenant: str, run_id: str, index: int, columns: dict[str, Any]) -> None:
        if columns:
            db.execute(
                f"UPDATE steps SET {', '.join(f'{c} = ?' for c in columns)} WHERE tenant = ? AND run_id = ? AND idx = ?",
                (*columns.values(), tenant, run_id, index),
            )

    def _write_claim(self, tenant: str, run_id: str, claim: Claim, seen: StepState) -> None:
        attempt, entry = claim.attempt, claim.entry
        key = (tenant, run_id, attempt.index)
        with self._write() as db:
            step = db.execute("SELECT status, attempts FROM steps WHERE tenant = ? AND run_id = ? AND idx = ?", key).fetchone()
            running, last_n = db.execute(
                "SELECT max(CASE WHEN status = 'running' THEN n END), max(n) FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ?",
                key,
            ).fetchone()
            if step is None or tuple(step) != (seen.status, seen.attempts) or running is not None or (last_n or 0) != seen.last_n:
                raise Refused()
            if entry is not None:
                found = self._journal_row(db, tenant, run_id, entry.op_id)
                if (found is not None) if claim.created else (found is None or found.status != JournalStatus.pending):
                    raise Refused()
            db.execute(
                "INSERT INTO attempts (tenant, run_id, idx, n, token, started_at, resumed_at, status, op_id, worker)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    *key,
                    attempt.n,
                    attempt.token,
                    attempt.started_at,
                    attempt.resumed_at,
                    attempt.op_id,
                    worker_text(attempt.worker),
                ),
            )
            if claim.layers is not None:
                db.execute(_UPSERT_LAYERS, (*key, _layers(claim.layers)))
            db.execute(
                "UPDATE steps SET status = 'running', attempts = ?, started_at = coalesce(started_at, ?),"
                " message = coalesce(?, message) WHERE tenant = ? AND run_id = ? AND idx = ?",
                (attempt.n, attempt.started_at, claim.message, *key),
            )
            if entry is not None:  # the claim and its journal entry, in the same transaction
                self._put_entry(db, entry)

    @staticmethod
    def _put_entry(db: sqlite3.Connection, entry: JournalEntry) -> None:
        db.execute(
            "INSERT INTO journal (tenant, run_id, op_id, idx, status, attempt, token, started_at, resumed_at, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, run_id, op_id) DO UPDATE SET status = excluded.status,"
            " attempt = excluded.attempt, token = excluded.token, started_at = excluded.started_at, resumed_at = excluded.resumed_at",
            (
                entry.tenant,
                entry.run_id,
                entry.op_id,
                entry.index,
                entry.status.value,
                entry.attempt,
                entry.token,
                entry.started_at,
                entry.resumed_at,
                entry.created_at,
                entry.expires_at,
            ),
        )

    def _write_entry(self, entry: JournalEntry, seen: StepState | None) -> None:
        with self._write() as db:
            found = self._journal_row(db, entry.tenant, entry.run_id, entry.op_id)
            if entry.status == JournalStatus.pending:
                step = db.execute(
                    "SELECT 1 FROM steps WHERE tenant = ? AND run_id = ? AND idx = ?", (entry.tenant, entry.run_id, entry.index)
                ).fetchone()
                if found is not None or step is None:
                    raise Refused()
            elif found is None or found.status != JournalStatus.pending:
                raise Refused()
            self._put_entry(db, entry)

    def _write_attempt(self, ref: AttemptRef, write: AttemptWrite) -> None:
        key = (ref.tenant, ref.run_id, ref.index)
        columns = columns_of(Step, write.step)
        with self._write() as db:
            self._fence(db, ref)
            for call in write.calls:
                db.execute(_UPSERT_CALL, (*key, call.id, call.n, call.model_dump_json()))
            if write.layers is not None:
                db.execute(_UPSERT_LAYERS, (*key, _layers(write.layers)))
            if write.heartbeat_at is not None:
                db.execute(
                    "UPDATE attempts SET heartbeat_at = ? WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                    (write.heartbeat_at, *key, ref.n),
                )
            if write.status is not None:
                kind = None if write.reason_kind is None else write.reason_kind.value
                db.execute(
                    "UPDATE attempts SET status = ?, ended_at = ?, reason = ?, reason_kind = ?"
                    " WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                    (write.status.value, write.ended_at, write.reason, kind, *key, ref.n),
                )
            self._set_step(db, *key, columns)

    def _append(self, tenant: str, run_id: str, index: int, line: Event | list[str], fence: AttemptRef | None) -> None:
        with self._write() as db:
            if fence is not None:
                self._fence(db, fence)
            if isinstance(line, Event):
                db.execute(_INSERT_EVENT, _event_row(tenant, run_id, index, line))
            else:
                assert fence is not None, "observed ids are an attempt's"
                self._insert_observed(db, fence, line)
