"""The embedded store's schema as numbered migrations: opening a database applies those it
lacks, in order, in one transaction; a second open changes nothing; a database a newer
laneflow migrated is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from laneflow.adapters.store import sqlite_schema
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.adapters.store.sqlite_schema import MIGRATIONS, DatabaseTooNew

LATEST = MIGRATIONS[-1][0]

LABEL = (LATEST + 1, "runs.label", ("ALTER TABLE runs ADD COLUMN label TEXT", "CREATE INDEX runs_by_label ON runs (label)"))


def version(path: Path) -> tuple[int, int]:
    """(user_version, schema_version): the migrations applied, and SQLite's count of schema changes."""
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0], db.execute("PRAGMA schema_version").fetchone()[0]


def columns(path: Path, table: str) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def made_by_the_first_migrations(path: Path, count: int) -> None:
    """A database as a laneflow whose list ended at MIGRATIONS[count - 1] left it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    sqlite_schema.MIGRATIONS, kept = MIGRATIONS[:count], sqlite_schema.MIGRATIONS
    try:
        sqlite_schema.migrate(db, str(path))
    finally:
        sqlite_schema.MIGRATIONS = kept
    db.execute("COMMIT")
    db.close()


def test_a_new_database_gets_every_migration(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "new.db").close()
    assert version(tmp_path / "new.db")[0] == LATEST
    assert {"segments", "driver"} <= columns(tmp_path / "new.db", "runs")


def test_a_database_of_the_current_schema_gains_a_later_migration_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    made_by_the_first_migrations(path, len(MIGRATIONS))
    with sqlite3.connect(path) as db:  # a run it holds stays
        db.execute(
            "INSERT INTO runs (tenant, id, workspace, flow, status, input, created_at, options, flow_spec)"
            " VALUES ('local', 'r1', 'w', 'f', 'done', '{}', '2026-01-01', '{}', '{}')"
        )
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (*MIGRATIONS, LABEL))
    SqliteStore(path).close()
    migrated = version(path)
    assert migrated[0] == LATEST + 1 and "label" in columns(path, "runs")
    SqliteStore(path).close()
    assert version(path) == migrated  # nothing applied again, no schema change at all
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT id FROM runs").fetchall() == [("r1",)]


def test_a_database_made_before_the_list_gets_the_tables_and_columns_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:  # as a version 8 of the branch without continue-as-new left it
        db.execute("ALTER TABLE runs DROP COLUMN segments")
        db.execute("ALTER TABLE gates DROP COLUMN note")
        db.execute("DROP TABLE observed")
        db.execute("PRAGMA user_version = 8")
    SqliteStore(path).close()
    assert version(path)[0] == LATEST
    assert "segments" in columns(path, "runs") and "note" in columns(path, "gates") and columns(path, "observed")
    before = version(path)
    SqliteStore(path).close()
    assert version(path) == before


def test_a_migration_that_fails_leaves_the_database_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    SqliteStore(path).close()
    before = version(path)
    broken = (
        LATEST + 1,
        "a column, then a statement that fails",
        ("ALTER TABLE runs ADD COLUMN label TEXT", "INSERT INTO nowhere VALUES (1)"),
    )
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (*MIGRATIONS, broken))
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        SqliteStore(path)
    assert version(path) == before and "label" not in columns(path, "runs")


def test_a_database_a_newer_laneflow_migrated_is_refused_naming_its_file(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {LATEST + 1}")
    with pytest.raises(DatabaseTooNew, match=f"{path}.*version {LATEST + 1}.*knows \\({LATEST}\\)"):
        SqliteStore(path)
    assert version(path)[0] == LATEST + 1
