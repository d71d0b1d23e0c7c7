"""The embedded store's tables, the numbered migrations that make them (`MIGRATIONS`; a
database's `PRAGMA user_version` is the last it has), and how rows are written and rendered
as JSON.

See laneflow.adapters.store.sqlite for what each table holds and why.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection
from typing import Any

from laneflow.adapters.store.encoding import cost, dumps, worker_text
from laneflow.adapters.store.rulebook_base import damaged
from laneflow.domain.errors import RecordDamaged, Unavailable
from laneflow.domain.records import Run, Step

# Columns added after a table was first shipped: (table, column, declaration).
ADDED_COLUMNS = (
    ("runs", "driver", "TEXT"),
    ("attempts", "heartbeat_at", "TEXT"),
    ("steps", "message", "TEXT"),
    ("attempts", "reason_kind", "TEXT"),
    ("gates", "ended_at", "TEXT"),
    ("gates", "note", "TEXT"),
    ("steps", "cache_break", "TEXT"),
    ("steps", "prefix", "TEXT"),
    ("runs", "segments", "INTEGER NOT NULL DEFAULT 0"),
)

# Columns added by migration 10 (the cache across runs), with the prefix registry's table.
ADDED_IN_10 = (
    ("steps", "cache_ttl", "TEXT"),
    ("steps", "cache_ttl_reason", "TEXT"),
    ("steps", "savings_usd", "REAL NOT NULL DEFAULT 0"),
    ("runs", "savings_usd", "REAL NOT NULL DEFAULT 0"),
)

# Columns added by migration 11 (redrive): how many times a person redrove a failed run.
ADDED_IN_11 = (("runs", "redrives", "INTEGER NOT NULL DEFAULT 0"),)

# The prefix registry (laneflow.domain.prefixes): one row per (tenant, prefix key), its
# record as JSON, its version (every write is conditional on the one read), and whether an
# attempt is writing it now (reconcile looks at those only).
PREFIXES_SCHEMA = """
CREATE TABLE IF NOT EXISTS prefixes (
    tenant   TEXT NOT NULL,
    key      TEXT NOT NULL,
    version  INTEGER NOT NULL,
    writing  INTEGER NOT NULL DEFAULT 0,
    record   TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS prefixes_writing ON prefixes (writing) WHERE writing = 1
"""

# Schedules (laneflow.domain.schedules): one row per (tenant, schedule), its record as JSON,
# its version (every write is conditional on the one read), and whether it is enabled (what
# `serve` fires; a partial index holds those); and the run each started firing made.
SCHEDULES_SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules (
    tenant      TEXT NOT NULL,
    id          TEXT NOT NULL,
    version     INTEGER NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    record      TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS schedules_enabled ON schedules (enabled) WHERE enabled = 1;
CREATE TABLE IF NOT EXISTS schedule_runs (
    tenant       TEXT NOT NULL,
    schedule_id  TEXT NOT NULL,
    scheduled_at TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    PRIMARY KEY (tenant, schedule_id, scheduled_at)
) WITHOUT ROWID
"""

BUSY_TIMEOUT_S = 10.0


SCHEMA = """
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
    savings_usd    REAL NOT NULL DEFAULT 0,
    drives         INTEGER NOT NULL DEFAULT 0,
    segments       INTEGER NOT NULL DEFAULT 0,
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
    cache_break  TEXT,
    prefix       TEXT,
    cache_ttl    TEXT,
    cache_ttl_reason TEXT,
    savings_usd  REAL NOT NULL DEFAULT 0,
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
    ended_at  TEXT,
    note      TEXT,
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

CREATE TABLE IF NOT EXISTS notes (
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    id      TEXT NOT NULL,
    to_idx  INTEGER NOT NULL,
    status  TEXT,
    body    TEXT NOT NULL,
    PRIMARY KEY (tenant, run_id, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS notes_open ON notes (status) WHERE status = 'open';

CREATE TABLE IF NOT EXISTS observed (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    n       INTEGER NOT NULL,
    id      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS observed_by_step ON observed (tenant, run_id, idx, seq);

CREATE TABLE IF NOT EXISTS prompt_layers (
    tenant  TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    layers  TEXT NOT NULL,
    PRIMARY KEY (tenant, run_id, idx)
) WITHOUT ROWID;
"""


class DatabaseTooNew(Unavailable):
    """The database file was last migrated by a newer laneflow than this one: its tables may
    hold what this code would misread or lose."""


# An ALTER TABLE ... ADD COLUMN a database may already have: a database of version 8 was made
# by either of two branches, each adding columns of its own (`_apply` leaves a column that is
# there, and a table that is not: it is made with its columns by a later statement).
_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+) ")

# The schema's history, in order: (number, what it does, its statements). A database's
# `PRAGMA user_version` is the number of the last one it has; opening a store applies the
# ones after it, in order, in one transaction. Versions 1 to 8 came before this list:
# migration 9 brings a database of any of them (or a new, empty one) to the tables of
# version 9, every column added since a table first shipped added where it is missing.
# A schema change is a new migration at the end, never an edit of one shipped.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        9,
        "every table and index of version 9; the columns a database of an earlier version lacks",
        (
            *(f"ALTER TABLE {table} ADD COLUMN {column} {decl}" for table, column, decl in ADDED_COLUMNS),
            *(statement.strip() for statement in SCHEMA.split(";") if statement.strip()),
        ),
    ),
    (
        10,
        "the prefix registry; steps' cache_ttl, cache_ttl_reason and savings_usd; runs' savings_usd",
        (
            *(f"ALTER TABLE {table} ADD COLUMN {column} {decl}" for table, column, decl in ADDED_IN_10),
            *(statement.strip() for statement in PREFIXES_SCHEMA.split(";") if statement.strip()),
        ),
    ),
    (
        11,
        "runs' redrives",
        tuple(f"ALTER TABLE {table} ADD COLUMN {column} {decl}" for table, column, decl in ADDED_IN_11),
    ),
    (
        12,
        "schedules, and the runs their firings started",
        tuple(statement.strip() for statement in SCHEDULES_SCHEMA.split(";") if statement.strip()),
    ),
)


def _apply(db: sqlite3.Connection, statement: str) -> None:
    added = _ADD_COLUMN.match(statement)
    if added:
        table, column = added.groups()
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not have or column in have:
            return
    db.execute(statement)


def migrate(db: sqlite3.Connection, path: str) -> int:
    """Apply the migrations the database at `path` lacks, in order, inside the caller's
    write transaction (so they land together or not at all); the version it is now at.
    `DatabaseTooNew` if a newer laneflow migrated it past what this code knows."""
    latest = MIGRATIONS[-1][0]
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > latest:
        raise DatabaseTooNew(
            f"the store {path} is at schema version {version}, newer than this laneflow knows ({latest}):"
            " open it with the laneflow that last wrote it, or a newer one"
        )
    for number, _, statements in MIGRATIONS:
        if number > version:
            for statement in statements:
                _apply(db, statement)
            db.execute(f"PRAGMA user_version = {int(number)}")
            version = number
    return version


# Model field -> (column, kind). The kind says how a value is written: as is ("plain"), as an
# enum's value, as 0/1, as JSON text, as a rounded cost, or as a worker reference's text.
# (Reading needs no kinds: 0/1, enum values and a worker's text validate as they are, and
# JSON columns are embedded with json().)
RUN_COLUMNS: dict[str, tuple[str, str]] = {
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
    "savings_usd": ("savings_usd", "cost"),
    "drives": ("drives", "plain"),
    "segments": ("segments", "plain"),
    "redrives": ("redrives", "plain"),
    "error": ("error", "plain"),
    "model": ("model", "plain"),
    "options": ("options", "json"),
    "execution": ("execution", "plain"),
    "driver": ("driver", "worker"),
    "workspace_uri": ("workspace_uri", "plain"),
    "flow_spec": ("flow_spec", "json"),
}


STEP_COLUMNS: dict[str, tuple[str, str]] = {
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
    "cache_break": ("cache_break", "json"),
    "prefix": ("prefix", "json"),
    "cache_ttl": ("cache_ttl", "plain"),
    "cache_ttl_reason": ("cache_ttl_reason", "plain"),
    "savings_usd": ("savings_usd", "cost"),
}

STEP_CHILDREN = ("events", "calls", "prompt_layers")  # kept in tables of their own


ATTEMPT_COLUMNS: dict[str, tuple[str, str]] = {
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
    "worker": ("worker", "worker"),
    "heartbeat_at": ("heartbeat_at", "plain"),
    "op_id": ("op_id", "plain"),
}


EVENT_COLUMNS: dict[str, tuple[str, str]] = {
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


def damage(
    db: sqlite3.Connection, table: str, columns: dict[str, tuple[str, str]], where: str, args: Collection[Any], what: str
) -> RecordDamaged:
    """Why a row `_as_json` rendered as NULL cannot be read: which of its fields."""
    json_fields = [field for field, (_, kind) in columns.items() if kind == "json"]
    checks = _json_checks(columns)
    row = db.execute(
        f"SELECT {', '.join(checks)} FROM {table} WHERE {where} AND NOT ({' AND '.join(checks)}) LIMIT 1", tuple(args)
    ).fetchone()
    bad = [field for field, ok in zip(json_fields, row, strict=True) if not ok] if row else []
    return damaged(what, bad)


RUN_JSON = _as_json(RUN_COLUMNS)

# A run without its input (`get_run(input=False)`), and its input alone (`get_run_input`).
RUN_HEAD_COLUMNS = {field: column for field, column in RUN_COLUMNS.items() if field != "input"}

RUN_HEAD_JSON = _as_json(RUN_HEAD_COLUMNS)

RUN_INPUT_COLUMNS = {"input": RUN_COLUMNS["input"]}

RUN_INPUT_JSON = _as_json(RUN_INPUT_COLUMNS)

STEP_JSON = _as_json(STEP_COLUMNS)

STEP_JSON_WITHOUT_MESSAGE = _as_json({field: column for field, column in STEP_COLUMNS.items() if field != "message"})

ATTEMPT_JSON = _as_json(ATTEMPT_COLUMNS)

EVENT_JSON = _as_json(EVENT_COLUMNS)


def array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def splice(obj: str, **members: str) -> str:
    """A JSON object (as json_object() renders it: '{...}', never empty) with members, given
    as JSON text, added before its closing brace."""
    return obj[:-1] + "".join(f',"{name}":{value}' for name, value in members.items()) + "}"


def check_columns_cover_models() -> None:
    """A model field with no column would be dropped silently on every write; refuse to open
    the store instead, so whoever adds a field to Run or Step also gives it a column."""
    missing = sorted(set(Run.model_fields) - set(RUN_COLUMNS) - {"steps"}) + sorted(
        f"step.{f}" for f in set(Step.model_fields) - set(STEP_COLUMNS) - set(STEP_CHILDREN)
    )
    if missing:
        raise RuntimeError(f"SqliteStore has no column for: {', '.join(missing)} (add them to store/sqlite_schema.py)")


def to_db(kind: str, value: Any) -> Any:
    """A model field's value as its column keeps it."""
    if kind == "json":
        return dumps(value)
    if kind == "enum":
        return value.value
    if kind == "bool":
        return int(bool(value))
    if kind == "cost":
        return cost(value)
    if kind == "worker":
        return worker_text(value)
    return value


def columns_of(model: type[Run] | type[Step], values: dict[str, Any]) -> dict[str, Any]:
    """Validated field values as column -> stored value."""
    columns = RUN_COLUMNS if model is Run else STEP_COLUMNS
    return {columns[field][0]: to_db(columns[field][1], value) for field, value in values.items()}
