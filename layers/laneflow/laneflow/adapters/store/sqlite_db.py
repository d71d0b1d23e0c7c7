"""The embedded store's database file: one connection per process behind a lock, its write
and read transactions, and the rows every part of the store reads as JSON (see
laneflow.adapters.store.sqlite for why one connection, and what each table holds)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from laneflow.adapters.store.primitives import Doc, Fenced, Refused
from laneflow.adapters.store.sqlite_schema import (
    ATTEMPT_JSON,
    BUSY_TIMEOUT_S,
    EVENT_COLUMNS,
    EVENT_JSON,
    RUN_COLUMNS,
    RUN_HEAD_COLUMNS,
    RUN_HEAD_JSON,
    RUN_INPUT_COLUMNS,
    RUN_INPUT_JSON,
    RUN_JSON,
    STEP_COLUMNS,
    STEP_JSON,
    STEP_JSON_WITHOUT_MESSAGE,
    array,
    check_columns_cover_models,
    damage,
    migrate,
    splice,
)
from laneflow.domain.errors import RecordDamaged, TransientError
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import Attempt, AttemptRef, AttemptStatus, JournalEntry

_JOURNAL_FIELDS = ("op_id", "index", "status", "attempt", "token", "started_at", "resumed_at", "created_at", "expires_at")


def _chosen(group: int | None, filtered: StepFilter | None) -> tuple[str, list[str | int]]:
    """The SQL conditions (and their arguments) for one group and a `StepFilter`'s
    per-step filters."""
    args: list[str | int]
    sql, args = "", []
    if group is not None:
        sql, args = " AND grp = ?", [group]
    if filtered is None:
        return sql, args
    if filtered.statuses is not None:
        picked = sorted(filtered.statuses)
        sql, args = sql + f" AND status IN ({', '.join('?' * len(picked))})", [*args, *picked]
    if filtered.flow:
        sql += " AND rescue_of IS NULL"
    if filtered.settling:
        sql += " AND (rescue_of IS NOT NULL OR status NOT IN ('completed', 'skipped'))"
    if filtered.low is not None:
        sql, args = sql + " AND idx >= ?", [*args, filtered.low]
    if filtered.high is not None:
        sql, args = sql + " AND idx <= ?", [*args, filtered.high]
    if filtered.agent is not None:
        sql, args = sql + " AND agent = ?", [*args, filtered.agent]
    if filtered.started_by is not None:
        sql, args = sql + " AND started_at <= ?", [*args, filtered.started_by]
    return sql, args


def _busy(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (SQLITE_BUSY, SQLITE_LOCKED)."""
    return "locked" in str(error) or "busy" in str(error)


class SqliteDatabase:
    """One database file: its connection, transactions and rows. `busy_timeout_s`: how long
    a write waits for another connection's lock before it is a `TransientError`."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        check_columns_cover_models()
        path = os.fspath(path)
        self.path = path if path == ":memory:" else os.path.abspath(os.path.expanduser(path))
        self.url = f"sqlite:///{self.path}"
        self.busy_timeout_s = busy_timeout_s
        self._open()

    def _open(self) -> None:
        """Connect, set the pragmas, and apply the migrations the database lacks (all of
        them to a new one: sqlite_schema.MIGRATIONS)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        with self._write() as db:
            migrate(db, self.path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """The process's connection, held by this thread until the block ends."""
        if self._pid != os.getpid():
            # A forked child must not use its parent's connection (nor its lock, which a
            # parent thread may have held at the fork): open its own. (`:memory:` is per
            # process, so a child starts empty.)
            self._open()
        with self._lock:
            try:
                yield self._conn
            except sqlite3.OperationalError as error:
                if _busy(error):
                    raise TransientError(
                        f"the store {self.path} stayed locked by another connection past {self.busy_timeout_s:g} s: {error}"
                    ) from error
                raise

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: whole or absent. The write lock is taken up front
        (BEGIN IMMEDIATE) so reads inside it are the state the write is conditional on."""
        with self._connection() as conn:
            self._begin_immediate(conn)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, waiting for another connection's write lock in short pauses (0.2 ms,
        doubling to at most 2 ms) up to the busy timeout. SQLite's own busy handler sleeps 25 to
        100 ms at a time once a wait grows, and the engine's process and its step workers take
        turns at the write lock many times a step: a waiting sibling's gate write then stalled
        its lane's release by hundreds of ms. Only the write lock is waited for this way (reads
        keep the busy timeout; in WAL mode they rarely wait at all)."""
        conn.execute("PRAGMA busy_timeout = 0")  # a pragma of the connection: no I/O, about 1 us
        try:
            deadline, pause = time.monotonic() + self.busy_timeout_s, 0.0002
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as error:
                    if not _busy(error) or time.monotonic() > deadline:
                        raise
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query inside it sees the same snapshot."""
        with self._connection() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    # -- rows ---------------------------------------------------------------------------

    @staticmethod
    def _run_json(db: sqlite3.Connection, tenant: str, run_id: str, *, part: str = "whole") -> str | None:
        """The run row as JSON: whole, its `head` (all but its input) or its `input` alone."""
        rendered, columns = {
            "whole": (RUN_JSON, RUN_COLUMNS),
            "head": (RUN_HEAD_JSON, RUN_HEAD_COLUMNS),
            "input": (RUN_INPUT_JSON, RUN_INPUT_COLUMNS),
        }[part]
        row = db.execute(f"SELECT {rendered} FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
        if row is None:
            return None
        if row[0] is None:
            raise damage(db, "runs", columns, "tenant = ? AND id = ?", (tenant, run_id), f"run {run_id!r}")
        text: str = row[0]
        return text

    @staticmethod
    def _steps_json(
        db: sqlite3.Connection,
        tenant: str,
        run_id: str,
        *,
        index: int | None = None,
        group: int | None = None,
        detail: bool = False,
        messages: bool = True,
        filtered: StepFilter | None = None,
    ) -> list[tuple[int, str]]:
        """(index, JSON) of a run's steps (or step `index`, or group `group`, of those what
        `filtered` admits), by index. With `detail`, each carries its events, calls and
        prompt layers: one query per table."""
        args: list[str | int]
        where, args = "tenant = ? AND run_id = ?", [tenant, run_id]
        if index is not None:
            where, args = where + " AND idx = ?", args + [index]
        chosen, chosen_args = _chosen(group, filtered)
        rendered = STEP_JSON if messages else STEP_JSON_WITHOUT_MESSAGE
        source, picked, picked_args = "steps", where + chosen, args + chosen_args
        if filtered is not None and filtered.per_lane is not None:  # each lane's first few, counted in SQL
            source = f"(SELECT *, ROW_NUMBER() OVER (PARTITION BY agent, model ORDER BY idx) AS nth FROM steps WHERE {picked})"
            picked, picked_args = "nth <= ?", [*picked_args, filtered.per_lane]
        limit = "" if filtered is None or filtered.limit is None else f" LIMIT {int(filtered.limit)}"
        steps = db.execute(f"SELECT idx, {rendered} FROM {source} WHERE {picked} ORDER BY idx{limit}", picked_args).fetchall()
        for idx, step in steps:
            if step is None:
                what = f"step {idx} of run {run_id!r}"
                raise damage(db, "steps", STEP_COLUMNS, "tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, idx), what)
        if not detail:
            return steps
        events: dict[int, list[str]] = defaultdict(list)
        for idx, event in db.execute(f"SELECT idx, {EVENT_JSON} FROM events WHERE {where} ORDER BY idx, seq", args):
            if event is None:
                what = f"an event of step {idx} of run {run_id!r}"
                raise damage(db, "events", EVENT_COLUMNS, "tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, idx), what)
            events[idx].append(event)
        calls: dict[int, list[str]] = defaultdict(list)
        for idx, call in db.execute(f"SELECT idx, body FROM calls WHERE {where} ORDER BY idx, n, id", args):
            calls[idx].append(call)
        layers = dict(db.execute(f"SELECT idx, layers FROM prompt_layers WHERE {where}", args).fetchall())
        return [
            (idx, splice(step, events=array(events[idx]), calls=array(calls[idx]), prompt_layers=layers.get(idx, "[]")))
            for idx, step in steps
        ]

    @staticmethod
    def _attempt_row(db: sqlite3.Connection, tenant: str, run_id: str, index: int, n: int) -> Attempt | None:
        row = db.execute(
            f"SELECT {ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
            (tenant, run_id, index, n),
        ).fetchone()
        return None if row is None else Attempt.model_validate_json(row[0])

    @staticmethod
    def _journal_row(db: sqlite3.Connection, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        row = db.execute(
            "SELECT op_id, idx, status, attempt, token, started_at, resumed_at, created_at, expires_at FROM journal"
            " WHERE tenant = ? AND run_id = ? AND op_id = ?",
            (tenant, run_id, op_id),
        ).fetchone()
        return None if row is None else JournalEntry(tenant=tenant, run_id=run_id, **dict(zip(_JOURNAL_FIELDS, row, strict=True)))

    def _runs(self, db: sqlite3.Connection, rows: list[tuple[str, str, str | None]]) -> list[tuple[str, Doc | RecordDamaged]]:
        """(id, JSON or why it cannot be read) of (tenant, id, JSON) rows."""
        out: list[tuple[str, Doc | RecordDamaged]] = []
        for tenant, run_id, doc in rows:
            if doc is None:
                out.append(
                    (run_id, damage(db, "runs", RUN_COLUMNS, "tenant = ? AND id = ?", (tenant, run_id), f"run {run_id!r}"))
                )
            else:
                out.append((run_id, doc))
        return out

    @staticmethod
    def _fence(db: sqlite3.Connection, ref: AttemptRef) -> None:
        """Refuse (with what was found) unless the stored attempt has exactly `ref`'s
        identity and is running: inside the write transaction it belongs to."""
        found = SqliteDatabase._attempt_row(db, ref.tenant, ref.run_id, ref.index, ref.n)
        if (
            found is None
            or (found.token, found.started_at, found.resumed_at) != (ref.token, ref.started_at, ref.resumed_at)
            or found.status != AttemptStatus.running
        ):
            raise Refused(Fenced(found))
