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
cannot interleave with another writer, and any error rolls the whole write back.

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

Floats: costs are rounded to 6 decimals whenever they are stored or added to, so sums of
many small costs do not show binary drift (0.1 + 0.2 is stored as 0.3).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from laneflow.domain.errors import (
    AttemptEnded,
    Conflict,
    NotFound,
    RecordDamaged,
    RunNotFound,
)
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    FailureKind,
    JournalEntry,
    JournalStatus,
    ModelCall,
    PromptLayer,
    Run,
    RunStatus,
    Step,
    StepStatus,
    utcnow,
)
from laneflow.domain.tenants import check_tenant
from laneflow.ports import RUN_FIELDS, STEP_FIELDS, Store

log = logging.getLogger("laneflow.store")


SCHEMA_VERSION = 5

# Columns added after a table was first shipped: (table, column, declaration). A database
# made by an older version gets them on open.
_ADDED_COLUMNS = (
    ("runs", "driver", "TEXT"),
    ("attempts", "heartbeat_at", "TEXT"),
    ("steps", "message", "TEXT"),
    ("attempts", "reason_kind", "TEXT"),
)

BUSY_TIMEOUT_S = 10.0

COST_DECIMALS = 6


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    tenant         TEXT NOT NULL,
    id             TEXT NOT NULL,
    workspace      TEXT NOT NULL,
    flow           TEXT NOT NULL,
    status         TEXT NOT NULL,
    input          TEXT NOT NULL,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL,
    driven_at      TEXT,
    finished_at    TEXT,
    parked_at      TEXT,
    revision       TEXT,
    cost_usd       REAL NOT NULL DEFAULT 0,
    drives         INTEGER NOT NULL DEFAULT 0,
    error          TEXT,
    model          TEXT,
    options        TEXT NOT NULL,
    execution      TEXT,
    driver         TEXT,
    workspace_uri  TEXT NOT NULL DEFAULT '',
    flow_spec      TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS runs_by_tenant_created ON runs (tenant, created_at DESC);

CREATE TABLE IF NOT EXISTS steps (
    tenant       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    grp          INTEGER NOT NULL,
    entry        INTEGER NOT NULL DEFAULT 0,
    slot         INTEGER NOT NULL DEFAULT 0,
    agent        TEXT,
    item         TEXT NOT NULL,
    model        TEXT NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    cycle        INTEGER NOT NULL DEFAULT 0,
    instruction  TEXT NOT NULL DEFAULT '',
    message      TEXT,
    result       TEXT,
    conclusion   TEXT,
    data         TEXT NOT NULL,
    rescue_of    INTEGER,
    skip_reason  TEXT,
    error        TEXT,
    optional     INTEGER NOT NULL DEFAULT 0,
    cost_usd     REAL NOT NULL DEFAULT 0,
    started_at   TEXT,
    finished_at  TEXT,
    PRIMARY KEY (tenant, run_id, idx)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS attempts (
    tenant      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    token       TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    resumed_at  TEXT,
    status      TEXT NOT NULL,
    ended_at    TEXT,
    reason      TEXT,
    reason_kind TEXT,
    worker      TEXT,
    heartbeat_at TEXT,
    op_id       TEXT,
    PRIMARY KEY (tenant, run_id, idx, n)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_running ON attempts (status) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS runs_active ON runs (status) WHERE status IN ('queued', 'running', 'awaiting-approval');

CREATE TABLE IF NOT EXISTS journal (
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    op_id      TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    status     TEXT NOT NULL,
    attempt    INTEGER,
    token      TEXT,
    started_at TEXT,
    resumed_at TEXT,
    created_at TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, run_id, op_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS journal_pending ON journal (status) WHERE status = 'pending';
CREATE UNIQUE INDEX IF NOT EXISTS attempts_one_running
    ON attempts (tenant, run_id, idx) WHERE status = 'running';

CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant   TEXT NOT NULL,
    run_id   TEXT NOT NULL,
    idx      INTEGER NOT NULL,
    t        TEXT NOT NULL,
    type     TEXT NOT NULL,
    text     TEXT NOT NULL,
    attempt  INTEGER,
    data     TEXT
);
CREATE INDEX IF NOT EXISTS events_by_step ON events (tenant, run_id, idx, seq);

CREATE TABLE IF NOT EXISTS calls (
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    id      TEXT NOT NULL,
    n       INTEGER NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (tenant, run_id, idx, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS gates (
    tenant    TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    key       TEXT NOT NULL,
    opened_at TEXT,
    tokens    TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (tenant, run_id, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS handoffs (
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    key     TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (tenant, run_id, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS prompt_layers (
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    layers  TEXT NOT NULL,
    PRIMARY KEY (tenant, run_id, idx)
) WITHOUT ROWID;
"""


# Model field -> (column, kind). The kind says how a value is written: as is ("plain"), as an
# enum's value, as 0/1, as JSON text, or as a rounded cost. (Reading needs no kinds: 0/1 and
# enum values validate as they are, and JSON columns are embedded with json().)
_RUN_COLUMNS: dict[str, tuple[str, str]] = {
    "tenant": ("tenant", "plain"),
    "id": ("id", "plain"),
    "workspace": ("workspace", "plain"),
    "flow": ("flow", "plain"),
    "status": ("status", "enum"),
    "input": ("input", "json"),
    "stop_requested": ("stop_requested", "bool"),
    "created_at": ("created_at", "plain"),
    "driven_at": ("driven_at", "plain"),
    "finished_at": ("finished_at", "plain"),
    "parked_at": ("parked_at", "plain"),
    "revision": ("revision", "plain"),
    "cost_usd": ("cost_usd", "cost"),
    "drives": ("drives", "plain"),
    "error": ("error", "plain"),
    "model": ("model", "plain"),
    "options": ("options", "json"),
    "execution": ("execution", "plain"),
    "driver": ("driver", "plain"),
    "workspace_uri": ("workspace_uri", "plain"),
    "flow_spec": ("flow_spec", "json"),
}


_STEP_COLUMNS: dict[str, tuple[str, str]] = {
    "index": ("idx", "plain"),
    "group": ("grp", "plain"),
    "entry": ("entry", "plain"),
    "slot": ("slot", "plain"),
    "agent": ("agent", "plain"),
    "item": ("item", "json"),
    "model": ("model", "plain"),
    "status": ("status", "enum"),
    "attempts": ("attempts", "plain"),
    "cycle": ("cycle", "plain"),
    "instruction": ("instruction", "plain"),
    "message": ("message", "plain"),
    "result": ("result", "plain"),
    "conclusion": ("conclusion", "plain"),
    "data": ("data", "json"),
    "rescue_of": ("rescue_of", "plain"),
    "skip_reason": ("skip_reason", "plain"),
    "error": ("error", "plain"),
    "optional": ("optional", "bool"),
    "cost_usd": ("cost_usd", "cost"),
    "started_at": ("started_at", "plain"),
    "finished_at": ("finished_at", "plain"),
}

_STEP_CHILDREN = ("events", "calls", "prompt_layers")  # kept in tables of their own


_ATTEMPT_COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": ("run_id", "plain"),
    "index": ("idx", "plain"),
    "n": ("n", "plain"),
    "token": ("token", "plain"),
    "started_at": ("started_at", "plain"),
    "resumed_at": ("resumed_at", "plain"),
    "status": ("status", "plain"),
    "ended_at": ("ended_at", "plain"),
    "reason": ("reason", "plain"),
    "reason_kind": ("reason_kind", "plain"),
    "worker": ("worker", "plain"),
    "heartbeat_at": ("heartbeat_at", "plain"),
    "op_id": ("op_id", "plain"),
}


_EVENT_COLUMNS: dict[str, tuple[str, str]] = {
    "t": ("t", "plain"),
    "type": ("type", "plain"),
    "text": ("text", "plain"),
    "attempt": ("attempt", "plain"),
    "data": ("data", "json"),
}



def _json_checks(columns: dict[str, tuple[str, str]]) -> list[str]:
    """Per JSON column, a SQL expression that is 1 when it holds valid JSON (or NULL)."""
    return [f"({col} IS NULL OR json_valid({col}))" for col, kind in columns.values() if kind == "json"]



def _as_json(columns: dict[str, tuple[str, str]]) -> str:
    """A SQL expression rendering one row as the JSON object of its model, or NULL when a
    JSON column does not hold valid JSON (a NaN written before entrances refused it): json()
    would fail the whole query, and one damaged row must not stop reading the others."""
    members = (f"'{field}', " + (f"json({col})" if kind == "json" else col) for field, (col, kind) in columns.items())
    rendered = f"json_object({', '.join(members)})"
    checks = _json_checks(columns)
    return f"CASE WHEN {' AND '.join(checks)} THEN {rendered} END" if checks else rendered



def _damage(
    db: sqlite3.Connection, table: str, columns: dict[str, tuple[str, str]], where: str, args: Collection[Any], what: str
) -> RecordDamaged:
    """Why a row `_as_json` rendered as NULL cannot be read: which of its fields."""
    json_fields = [field for field, (_, kind) in columns.items() if kind == "json"]
    checks = _json_checks(columns)
    row = db.execute(
        f"SELECT {', '.join(checks)} FROM {table} WHERE {where} AND NOT ({' AND '.join(checks)}) LIMIT 1", tuple(args)
    ).fetchone()
    bad = [field for field, ok in zip(json_fields, row or ()) if not ok] or ["record"]
    verb = "is" if len(bad) == 1 else "are"
    return RecordDamaged(f"{what} cannot be read from the store: its {' and '.join(bad)} {verb} not valid JSON")



def _misfit(what: str, error: ValidationError) -> RecordDamaged:
    """A stored record that no longer fits its model (hand-edited, or of another version)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "record"
    return RecordDamaged(f"{what} cannot be read from the store: its {where} does not fit ({first.get('msg', 'invalid')})")



def _readable_runs(rows: list[tuple[str, str | None]]) -> list[Run]:
    """The runs of (id, JSON) rows, leaving out - with a warning in the log naming it - any
    that cannot be read, so one damaged run never stops a list (or reconcile)."""
    readable = []
    for run_id, text in rows:
        if text is None:
            log.warning("run %s left out: its stored record cannot be read (`laneflow show %s` says why)", run_id, run_id)
        else:
            readable.append((run_id, text))
    try:
        return _RUNS.validate_json(_array([text for _, text in readable]))
    except ValidationError:
        runs = []
        for run_id, text in readable:
            try:
                runs.append(Run.model_validate_json(text))
            except ValidationError:
                log.warning("run %s left out: its stored record cannot be read (`laneflow show %s` says why)", run_id, run_id)
        return runs



_RUN_JSON = _as_json(_RUN_COLUMNS)

_STEP_JSON = _as_json(_STEP_COLUMNS)

_ATTEMPT_JSON = _as_json(_ATTEMPT_COLUMNS)

_EVENT_JSON = _as_json(_EVENT_COLUMNS)


_RUNS = TypeAdapter(list[Run])

_STEPS = TypeAdapter(list[Step])

_ATTEMPTS = TypeAdapter(list[Attempt])



def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"



def _splice(obj: str, **members: str) -> str:
    """A JSON object (as json_object() renders it: '{...}', never empty) with members, given
    as JSON text, added before its closing brace."""
    return obj[:-1] + "".join(f',"{name}":{value}' for name, value in members.items()) + "}"



def _check_columns_cover_models() -> None:
    """A model field with no column would be dropped silently on every write; refuse to open
    the store instead, so whoever adds a field to Run or Step also gives it a column."""
    missing = sorted(set(Run.model_fields) - set(_RUN_COLUMNS) - {"steps"}) + sorted(
        f"step.{f}" for f in set(Step.model_fields) - set(_STEP_COLUMNS) - set(_STEP_CHILDREN)
    )
    if missing:
        raise RuntimeError(f"SqliteStore has no column for: {', '.join(missing)} (add them to store/sqlite.py)")



def _dumps(value: Any) -> str:
    return json.dumps(value, default=to_jsonable_python, ensure_ascii=False, separators=(",", ":"))



def _to_db(kind: str, value: Any) -> Any:
    if kind == "json":
        return _dumps(value)
    if kind == "enum":
        return value.value
    if kind == "bool":
        return int(bool(value))
    if kind == "cost":
        return round(float(value), COST_DECIMALS)
    return value



@cache
def _field_adapter(model: type[Run] | type[Step], field: str) -> TypeAdapter[Any]:
    return TypeAdapter(model.model_fields[field].annotation)



def _validated_changes(model: type[Run] | type[Step], allowed: frozenset[str], changes: dict[str, Any]) -> dict[str, Any]:
    """The changes, validated against the model's field types, as column -> stored value.

    Validation happens before any transaction starts, so a bad value changes nothing."""
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"{model.__name__.lower()} fields that cannot be changed here: {', '.join(unknown)}")
    columns = _RUN_COLUMNS if model is Run else _STEP_COLUMNS
    out: dict[str, Any] = {}
    for field, value in changes.items():
        column, kind = columns[field]
        out[column] = _to_db(kind, _field_adapter(model, field).validate_python(value))
    return out



def _statuses(values: Collection[Any]) -> list[str]:
    if isinstance(values, str):  # one status given bare (a StrEnum is a str too)
        values = [values]
    return [str(getattr(v, "value", v)) for v in values]



def _expiry(ttl_s: int) -> int:
    return int(time.time()) + ttl_s



def _refuse_status(what: str, found: str, expected: Collection[Any]) -> Conflict:
    return Conflict(f"{what} is {found}, not {' or '.join(_statuses(expected)) or 'any status'}")



class SqliteStore(Store):
    """The embedded store (see the module docstring for tables and concurrency)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        _check_columns_cover_models()
        path = os.fspath(path)
        self.path = path if path == ":memory:" else os.path.abspath(os.path.expanduser(path))
        self.url = f"sqlite:///{self.path}"
        self._open()

    def _open(self) -> None:
        """Connect, set the pragmas, and create the tables if this is a new database."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        with self._write() as db:
            if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                for table, column, decl in _ADDED_COLUMNS:
                    exists = db.execute(f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{table}'").fetchone()
                    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if exists and column not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

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
            yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: whole or absent. The write lock is taken up front
        (BEGIN IMMEDIATE) so reads inside it are the state the write is conditional on."""
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

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

    # -- reading rows -------------------------------------------------------------------

    @staticmethod
    def _require_run(db: sqlite3.Connection, tenant: str, run_id: str) -> None:
        if db.execute("SELECT 1 FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone() is None:
            raise RunNotFound(run_id)

    @staticmethod
    def _run_json(db: sqlite3.Connection, tenant: str, run_id: str) -> str:
        row = db.execute(f"SELECT {_RUN_JSON} FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        if row[0] is None:
            raise _damage(db, "runs", _RUN_COLUMNS, "tenant = ? AND id = ?", (tenant, run_id), f"run {run_id!r}")
        return row[0]

    @classmethod
    def _step_status(cls, db: sqlite3.Connection, tenant: str, run_id: str, index: int) -> tuple[str, int]:
        """The step's (status, attempts); RunNotFound / NotFound when absent."""
        row = db.execute(
            "SELECT status, attempts FROM steps WHERE tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, index)
        ).fetchone()
        if row is None:
            cls._require_run(db, tenant, run_id)
            raise NotFound(f"no step {index} in run {run_id!r}")
        return row

    @staticmethod
    def _steps_json(
        db: sqlite3.Connection,
        tenant: str,
        run_id: str,
        *,
        index: int | None = None,
        group: int | None = None,
        detail: bool = False,
    ) -> list[str]:
        """Steps of a run (or step `index`, or group `group`) as JSON, ordered by index. With
        `detail`, each carries its events, calls and prompt layers: one query per table."""
        where, args = "tenant = ? AND run_id = ?", [tenant, run_id]
        if index is not None:
            where, args = where + " AND idx = ?", args + [index]
        only_group, group_args = ("", []) if group is None else (" AND grp = ?", [group])
        steps = db.execute(
            f"SELECT idx, {_STEP_JSON} FROM steps WHERE {where}{only_group} ORDER BY idx", args + group_args
        ).fetchall()
        for idx, step in steps:
            if step is None:
                what = f"step {idx} of run {run_id!r}"
                raise _damage(db, "steps", _STEP_COLUMNS, "tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, idx), what)
        if not detail:
            return [step for _, step in steps]
        events: dict[int, list[str]] = defaultdict(list)
        for idx, event in db.execute(f"SELECT idx, {_EVENT_JSON} FROM events WHERE {where} ORDER BY idx, seq", args):
            if event is None:
                what = f"an event of step {idx} of run {run_id!r}"
                raise _damage(db, "events", _EVENT_COLUMNS, "tenant = ? AND run_id = ? AND idx = ?", (tenant, run_id, idx), what)
            events[idx].append(event)
        calls: dict[int, list[str]] = defaultdict(list)
        for idx, call in db.execute(f"SELECT idx, body FROM calls WHERE {where} ORDER BY idx, n, id", args):
            calls[idx].append(call)
        layers = dict(db.execute(f"SELECT idx, layers FROM prompt_layers WHERE {where}", args).fetchall())
        return [
            _splice(step, events=_array(events[idx]), calls=_array(calls[idx]), prompt_layers=layers.get(idx, "[]"))
            for idx, step in steps
        ]

    @classmethod
    def _step(cls, db: sqlite3.Connection, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        found = cls._steps_json(db, tenant, run_id, index=index, detail=detail)
        if not found:
            cls._require_run(db, tenant, run_id)
            raise NotFound(f"no step {index} in run {run_id!r}")
        try:
            return Step.model_validate_json(found[0])
        except ValidationError as e:
            raise _misfit(f"step {index} of run {run_id!r}", e) from None

    # -- fencing ------------------------------------------------------------------------

    @staticmethod
    def _fence(db: sqlite3.Connection, ref: AttemptRef) -> None:
        """Refuse (AttemptEnded) unless the stored attempt has exactly `ref`'s identity and
        is running. Called inside the write transaction the fenced write belongs to."""
        row = db.execute(
            "SELECT token = ? AND started_at = ? AND resumed_at IS ?, status FROM attempts"
            " WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
            (ref.token, ref.started_at, ref.resumed_at, ref.tenant, ref.run_id, ref.index, ref.n),
        ).fetchone()
        if row is not None and row[0] and row[1] == AttemptStatus.running.value:
            return
        what = f"attempt {ref.n} of step {ref.index} of run {ref.run_id!r}"
        if row is None:
            raise AttemptEnded(f"{what} does not exist")
        if not row[0]:
            raise AttemptEnded(f"{what} is not the attempt named (its token or times differ); it is {row[1]}")
        raise AttemptEnded(f"{what} has ended ({row[1]})")

    # -- runs ---------------------------------------------------------------------------

    # The runs' entry points check the tenant (check_tenant), as the DynamoDB store's keys do,
    # so both stores refuse the same names the same way; steps and attempts are only reached
    # through a run.

    def create_run(self, run: Run) -> None:
        check_tenant(run.tenant)
        columns = ", ".join(c for c, _ in _RUN_COLUMNS.values())
        marks = ", ".join("?" * len(_RUN_COLUMNS))
        values = tuple(_to_db(kind, getattr(run, f)) for f, (_, kind) in _RUN_COLUMNS.items())
        with self._write() as db:
            try:
                db.execute(f"INSERT INTO runs ({columns}) VALUES ({marks})", values)
            except sqlite3.IntegrityError:
                raise Conflict(f"run {run.id!r} exists") from None
            self._insert_steps(db, run.tenant, run.id, run.steps)

    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True) -> Run:
        check_tenant(tenant)
        with self._read() as db:
            run = self._run_json(db, tenant, run_id)
            step_list = self._steps_json(db, tenant, run_id, detail=detail) if steps else []
        try:
            return Run.model_validate_json(_splice(run, steps=_array(step_list)))
        except ValidationError as e:
            raise _misfit(f"run {run_id!r}", e) from None

    def list_runs(self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None) -> list[Run]:
        check_tenant(tenant)
        sql, args = f"SELECT id, {_RUN_JSON} FROM runs WHERE tenant = ?", [tenant]
        if status is not None:
            wanted = _statuses(status)
            sql, args = sql + f" AND status IN ({', '.join('?' * len(wanted))})", args + wanted
        # rowid breaks ties between runs created in the same millisecond: later insert first.
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        with self._read() as db:
            rows = db.execute(sql, [*args, limit]).fetchall()
        return _readable_runs(rows)

    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: dict[str, Any],
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_cost: float = 0.0,
        add_drives: int = 0,
    ) -> Run:
        check_tenant(tenant)
        # column -> (SQL expression, argument). An amount to add to a column that the same
        # call also sets lands on the value set.
        sets = {column: ("?", value) for column, value in _validated_changes(Run, RUN_FIELDS, changes).items()}
        if add_cost and "cost_usd" in sets:
            sets["cost_usd"] = ("?", round(sets["cost_usd"][1] + add_cost, COST_DECIMALS))
        elif add_cost:
            sets["cost_usd"] = (f"round(cost_usd + ?, {COST_DECIMALS})", float(add_cost))
        if add_drives and "drives" in sets:
            sets["drives"] = ("?", sets["drives"][1] + add_drives)
        elif add_drives:
            sets["drives"] = ("drives + ?", int(add_drives))
        with self._write() as db:
            found = db.execute("SELECT status FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
            if found is None:
                raise RunNotFound(run_id)
            if expect_status is not None and found[0] not in _statuses(expect_status):
                raise _refuse_status(f"run {run_id!r}", found[0], expect_status)
            if sets:
                db.execute(
                    f"UPDATE runs SET {', '.join(f'{c} = {expr}' for c, (expr, _) in sets.items())}"
                    " WHERE tenant = ? AND id = ?",
                    (*(arg for _, arg in sets.values()), tenant, run_id),
                )
            run = self._run_json(db, tenant, run_id)
        try:
            return Run.model_validate_json(run)
        except ValidationError as e:
            raise _misfit(f"run {run_id!r}", e) from None

    def request_stop(self, tenant: str, run_id: str) -> bool:
        check_tenant(tenant)
        with self._write() as db:
            row = db.execute("SELECT stop_requested FROM runs WHERE tenant = ? AND id = ?", (tenant, run_id)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            if row[0]:
                return False
            db.execute("UPDATE runs SET stop_requested = 1 WHERE tenant = ? AND id = ?", (tenant, run_id))
            return True

    # -- steps --------------------------------------------------------------------------

    def get_steps(self, tenant: str, run_id: str, *, group: int | None = None) -> list[Step]:
        with self._read() as db:
            self._require_run(db, tenant, run_id)
            steps = self._steps_json(db, tenant, run_id, group=group)
        try:
            return _STEPS.validate_json(_array(steps))
        except ValidationError as e:
            raise _misfit(f"a step of run {run_id!r}", e) from None

    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        with self._read() as db:
            return self._step(db, tenant, run_id, index, detail=detail)

    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        with self._write() as db:
            self._require_run(db, tenant, run_id)
            self._insert_steps(db, tenant, run_id, steps)

    @staticmethod
    def _insert_steps(db: sqlite3.Connection, tenant: str, run_id: str, steps: list[Step]) -> None:
        """Insert step rows, with whatever events, calls and layers the records carry."""
        columns = ", ".join(["tenant", "run_id"] + [c for c, _ in _STEP_COLUMNS.values()])
        marks = ", ".join("?" * (len(_STEP_COLUMNS) + 2))
        rows, events, calls, layers = [], [], [], []
        for step in steps:
            rows.append((tenant, run_id, *(_to_db(kind, getattr(step, f)) for f, (_, kind) in _STEP_COLUMNS.items())))
            events += [
                (tenant, run_id, step.index, e.t, e.type, e.text, e.attempt, None if e.data is None else _dumps(e.data))
                for e in step.events
            ]
            calls += [(tenant, run_id, step.index, c.id, c.n, c.model_dump_json()) for c in step.calls]
            if step.prompt_layers:
                layers.append((tenant, run_id, step.index, _dumps([p.model_dump() for p in step.prompt_layers])))
        try:
            db.executemany(f"INSERT INTO steps ({columns}) VALUES ({marks})", rows)
        except sqlite3.IntegrityError:
            raise Conflict(f"run {run_id!r}: a step index among {[s.index for s in steps]} is taken") from None
        db.executemany(
            "INSERT INTO events (tenant, run_id, idx, t, type, text, attempt, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            events,
        )
        db.executemany("INSERT OR REPLACE INTO calls (tenant, run_id, idx, id, n, body) VALUES (?, ?, ?, ?, ?, ?)", calls)
        db.executemany("INSERT INTO prompt_layers (tenant, run_id, idx, layers) VALUES (?, ?, ?, ?)", layers)

    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: dict[str, Any],
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        columns = _validated_changes(Step, STEP_FIELDS, changes)
        with self._write() as db:
            status, _ = self._step_status(db, tenant, run_id, index)
            if expect_status is not None and status not in _statuses(expect_status):
                raise _refuse_status(f"step {index} of run {run_id!r}", status, expect_status)
            self._set_step(db, tenant, run_id, index, columns)
            return self._step(db, tenant, run_id, index)

    @staticmethod
    def _set_step(db: sqlite3.Connection, tenant: str, run_id: str, index: int, columns: dict[str, Any]) -> None:
        if columns:
            db.execute(
                f"UPDATE steps SET {', '.join(f'{c} = ?' for c in columns)} WHERE tenant = ? AND run_id = ? AND idx = ?",
                (*columns.values(), tenant, run_id, index),
            )

    # -- attempts -----------------------------------------------------------------------

    def claim_attempt(
        self,
        tenant: str,
        run_id: str,
        index: int,
        *,
        token: str,
        started_at: str,
        op_id: str | None = None,
        resumed_at: str | None = None,
        expect_status: Collection[StepStatus] = (StepStatus.pending,),
        journal_ttl_s: int = 7 * 24 * 3600,
        worker: str | None = None,
        layers: list[PromptLayer] | None = None,
        message: str | None = None,
    ) -> Attempt:
        key = (tenant, run_id, index)
        with self._write() as db:
            if op_id is not None:
                entry = self._journal_row(db, tenant, run_id, op_id)
                if entry is not None and entry.status == JournalStatus.completed:
                    # A re-delivered invocation: it gets what the first one got, nothing new.
                    return self._attempt_row(db, tenant, run_id, entry.index, entry.attempt or 0)
                if entry is not None and entry.status == JournalStatus.cancelled:
                    raise Conflict(f"operation {op_id!r} was cancelled: its claim never landed")
            status, attempts = self._step_status(db, *key)
            if status not in _statuses(expect_status):
                raise _refuse_status(f"step {index} of run {run_id!r}", status, expect_status)
            running, last_n = db.execute(
                "SELECT max(CASE WHEN status = 'running' THEN n END), max(n) FROM attempts"
                " WHERE tenant = ? AND run_id = ? AND idx = ?",
                key,
            ).fetchone()
            if running is not None:
                raise Conflict(f"step {index} of run {run_id!r} already has a running attempt ({running})")
            # Normally step.attempts + 1. Should a loop reset lower `attempts`, numbers still go
            # up: an attempt's number is part of its identity and is never reused.
            n = max(attempts, last_n or 0) + 1
            db.execute(
                "INSERT INTO attempts (tenant, run_id, idx, n, token, started_at, resumed_at, status, op_id, worker)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (*key, n, token, started_at, resumed_at, op_id, worker),
            )
            if layers is not None:
                db.execute(
                    "INSERT INTO prompt_layers (tenant, run_id, idx, layers) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (tenant, run_id, idx) DO UPDATE SET layers = excluded.layers",
                    (*key, _dumps([layer.model_dump() for layer in layers])),
                )
            db.execute(
                "UPDATE steps SET status = 'running', attempts = ?, started_at = coalesce(started_at, ?),"
                " message = coalesce(?, message) WHERE tenant = ? AND run_id = ? AND idx = ?",
                (n, started_at, message, *key),
            )
            if op_id is not None:
                # The claim and its journal entry, in the same transaction.
                db.execute(
                    "INSERT INTO journal (tenant, run_id, op_id, idx, status, attempt, token, started_at, resumed_at,"
                    " created_at, expires_at) VALUES (?, ?, ?, ?, 'completed', ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (tenant, run_id, op_id) DO UPDATE SET status = 'completed', attempt = excluded.attempt,"
                    " token = excluded.token, started_at = excluded.started_at, resumed_at = excluded.resumed_at",
                    (tenant, run_id, op_id, index, n, token, started_at, resumed_at, utcnow(), _expiry(journal_ttl_s)),
                )
        return Attempt(
            run_id=run_id, index=index, n=n, token=token, started_at=started_at, resumed_at=resumed_at, op_id=op_id,
            worker=worker,
        )

    @staticmethod
    def _attempt_row(db: sqlite3.Connection, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        row = db.execute(
            f"SELECT {_ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
            (tenant, run_id, index, n),
        ).fetchone()
        if row is None:
            raise NotFound(f"no attempt {n} of step {index} of run {run_id!r}")
        return Attempt.model_validate_json(row[0])

    def heartbeat(self, ref: AttemptRef, at: str) -> None:
        with self._write() as db:
            self._fence(db, ref)
            db.execute(
                "UPDATE attempts SET heartbeat_at = ? WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                (at, ref.tenant, ref.run_id, ref.index, ref.n),
            )

    def running_attempts(self, tenant: str | None = None) -> list[tuple[str, Attempt]]:
        query = f"SELECT tenant, {_ATTEMPT_JSON} FROM attempts WHERE status = 'running'"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query += " AND tenant = ?"
            args = (tenant,)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY tenant, run_id, idx, n", args).fetchall()
        return [(row[0], Attempt.model_validate_json(row[1])) for row in rows]

    # -- the claim journal ----------------------------------------------------------------

    @staticmethod
    def _journal_row(db: sqlite3.Connection, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        row = db.execute(
            "SELECT op_id, idx, status, attempt, token, started_at, resumed_at, created_at, expires_at FROM journal"
            " WHERE tenant = ? AND run_id = ? AND op_id = ?",
            (tenant, run_id, op_id),
        ).fetchone()
        if row is None:
            return None
        keys = ("op_id", "index", "status", "attempt", "token", "started_at", "resumed_at", "created_at", "expires_at")
        return JournalEntry(tenant=tenant, run_id=run_id, **dict(zip(keys, row)))

    def journal_begin(self, tenant: str, run_id: str, op_id: str, index: int, *, ttl_s: int = 7 * 24 * 3600) -> JournalEntry:
        with self._write() as db:
            self._require_run(db, tenant, run_id)
            entry = self._journal_row(db, tenant, run_id, op_id)
            if entry is not None:
                return entry
            db.execute(
                "INSERT INTO journal (tenant, run_id, op_id, idx, status, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
                (tenant, run_id, op_id, index, utcnow(), _expiry(ttl_s)),
            )
            return self._journal_row(db, tenant, run_id, op_id)  # type: ignore[return-value]

    def journal_get(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        with self._read() as db:
            return self._journal_row(db, tenant, run_id, op_id)

    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        query = "SELECT tenant, run_id, op_id FROM journal WHERE status = 'pending'"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query += " AND tenant = ?"
            args = (tenant,)
        with self._read() as db:
            keys = db.execute(query + " ORDER BY created_at", args).fetchall()
            return [e for k in keys if (e := self._journal_row(db, *k)) is not None]

    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        with self._write() as db:
            entry = self._journal_row(db, tenant, run_id, op_id)
            if entry is None:
                raise NotFound(f"no journal entry {op_id!r} in run {run_id!r}")
            if entry.status != JournalStatus.pending:
                return entry
            landed = db.execute(
                "SELECT n, token, started_at, resumed_at FROM attempts WHERE tenant = ? AND run_id = ? AND op_id = ?"
                " ORDER BY n LIMIT 1",
                (tenant, run_id, op_id),
            ).fetchone()
            if landed:
                db.execute(
                    "UPDATE journal SET status = 'completed', attempt = ?, token = ?, started_at = ?, resumed_at = ?"
                    " WHERE tenant = ? AND run_id = ? AND op_id = ?",
                    (*landed, tenant, run_id, op_id),
                )
            else:
                db.execute(
                    "UPDATE journal SET status = 'cancelled' WHERE tenant = ? AND run_id = ? AND op_id = ?",
                    (tenant, run_id, op_id),
                )
            return self._journal_row(db, tenant, run_id, op_id)  # type: ignore[return-value]

    # -- active runs --------------------------------------------------------------------

    def active_runs(self, tenant: str | None = None) -> list[Run]:
        query = f"SELECT id, {_RUN_JSON} FROM runs WHERE status IN ('queued', 'running', 'awaiting-approval')"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            query += " AND tenant = ?"
            args = (tenant,)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY created_at", args).fetchall()
        return _readable_runs(rows)

    def get_attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        with self._read() as db:
            row = db.execute(
                f"SELECT {_ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                (tenant, run_id, index, n),
            ).fetchone()
        if row is None:
            raise NotFound(f"no attempt {n} of step {index} in run {run_id!r}")
        return Attempt.model_validate_json(row[0])

    def list_attempts(self, tenant: str, run_id: str, index: int | None = None) -> list[Attempt]:
        sql, args = f"SELECT {_ATTEMPT_JSON} FROM attempts WHERE tenant = ? AND run_id = ?", [tenant, run_id]
        if index is not None:
            sql, args = sql + " AND idx = ?", args + [index]
        with self._read() as db:
            self._require_run(db, tenant, run_id)
            rows = db.execute(sql + " ORDER BY idx, n", args).fetchall()
        return _ATTEMPTS.validate_json(_array([a for (a,) in rows]))

    def end_attempt(
        self,
        ref: AttemptRef,
        status: AttemptStatus,
        *,
        reason: str | None = None,
        step: dict[str, Any] | None = None,
        run_cost: float = 0.0,
        calls: list[ModelCall] | None = None,
        reason_kind: FailureKind | None = None,
    ) -> None:
        status = AttemptStatus(status)
        if status is AttemptStatus.running:
            raise ValueError("an attempt cannot be ended as running")
        kind = None if reason_kind is None else FailureKind(reason_kind).value
        columns = _validated_changes(Step, STEP_FIELDS, step or {})
        with self._write() as db:
            self._fence(db, ref)
            for call in calls or []:
                db.execute(
                    "INSERT INTO calls (tenant, run_id, idx, id, n, body) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (tenant, run_id, idx, id) DO UPDATE SET n = excluded.n, body = excluded.body",
                    (ref.tenant, ref.run_id, ref.index, call.id, call.n, call.model_dump_json()),
                )
            db.execute(
                "UPDATE attempts SET status = ?, ended_at = ?, reason = ?, reason_kind = ?"
                " WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                (status.value, utcnow(), reason, kind, ref.tenant, ref.run_id, ref.index, ref.n),
            )
            self._set_step(db, ref.tenant, ref.run_id, ref.index, columns)
            if run_cost:
                db.execute(
                    f"UPDATE runs SET cost_usd = round(cost_usd + ?, {COST_DECIMALS}) WHERE tenant = ? AND id = ?",
                    (float(run_cost), ref.tenant, ref.run_id),
                )

    def set_attempt_worker(self, ref: AttemptRef, worker: str) -> None:
        with self._write() as db:
            self._fence(db, ref)
            db.execute(
                "UPDATE attempts SET worker = ? WHERE tenant = ? AND run_id = ? AND idx = ? AND n = ?",
                (worker, ref.tenant, ref.run_id, ref.index, ref.n),
            )

    # -- trace --------------------------------------------------------------------------

    def add_event(
        self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None
    ) -> None:
        if attempt is not None and (attempt.tenant, attempt.run_id, attempt.index) != (tenant, run_id, index):
            raise ValueError(f"the attempt named (run {attempt.run_id!r}, step {attempt.index}) is not of run {run_id!r}, step {index}")
        with self._write() as db:
            if attempt is not None:
                self._fence(db, attempt)
            else:
                self._step_status(db, tenant, run_id, index)  # the step must exist
            db.execute(
                "INSERT INTO events (tenant, run_id, idx, t, type, text, attempt, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    tenant,
                    run_id,
                    index,
                    event.t,
                    event.type,
                    event.text,
                    event.attempt if attempt is None else attempt.n,
                    None if event.data is None else _dumps(event.data),
                ),
            )

    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        body = call.model_dump_json()
        with self._write() as db:
            self._fence(db, ref)
            db.execute(
                "INSERT INTO calls (tenant, run_id, idx, id, n, body) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (tenant, run_id, idx, id) DO UPDATE SET n = excluded.n, body = excluded.body",
                (ref.tenant, ref.run_id, ref.index, call.id, call.n, body),
            )

    def gate_wait(self, tenant: str, run_id: str, key: str, token: str) -> bool:
        with self._read() as db:  # most siblings arrive after the lead's reply began: no write
            row = db.execute(
                "SELECT opened_at FROM gates WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
        if row is not None and row[0] is not None:
            return True
        with self._write() as db:  # re-checked inside the write: the rendezvous stays exact
            row = db.execute(
                "SELECT opened_at, tokens FROM gates WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
            if row is not None and row[0] is not None:
                return True
            tokens = json.loads(row[1]) if row else []
            tokens.append(token)
            db.execute(
                "INSERT INTO gates (tenant, run_id, key, opened_at, tokens) VALUES (?, ?, ?, NULL, ?)"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET tokens = excluded.tokens",
                (tenant, run_id, key, _dumps(tokens)),
            )
            return False

    def gate_open(self, tenant: str, run_id: str, key: str) -> list[str]:
        with self._write() as db:
            row = db.execute(
                "SELECT opened_at, tokens FROM gates WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
            if row is not None and row[0] is not None:
                return []
            db.execute(
                "INSERT INTO gates (tenant, run_id, key, opened_at, tokens) VALUES (?, ?, ?, ?, '[]')"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET opened_at = excluded.opened_at, tokens = '[]'",
                (tenant, run_id, key, utcnow()),
            )
            return json.loads(row[1]) if row else []

    def put_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        with self._write() as db:
            self._require_run(db, tenant, run_id)
            db.execute(
                "INSERT INTO handoffs (tenant, run_id, key, body) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET body = excluded.body",
                (tenant, run_id, key, text),
            )

    def get_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        with self._read() as db:
            row = db.execute(
                "SELECT body FROM handoffs WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
        return None if row is None else row[0]

    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        body = _dumps([layer.model_dump() for layer in layers])
        with self._write() as db:
            self._fence(db, ref)
            db.execute(
                "INSERT INTO prompt_layers (tenant, run_id, idx, layers) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, run_id, idx) DO UPDATE SET layers = excluded.layers",
                (ref.tenant, ref.run_id, ref.index, body),
            )
