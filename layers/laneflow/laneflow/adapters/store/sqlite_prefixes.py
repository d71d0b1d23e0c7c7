"""The embedded store's prefix registry: its primitives over the `prefixes` table (one row
per tenant and prefix key, the record as JSON, its version the condition of every write)."""

from __future__ import annotations

from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.sqlite_db import SqliteDatabase
from laneflow.domain.prefixes import PrefixRecord


class SqlitePrefixes(SqliteDatabase):
    """The primitives of the prefix registry."""

    def _read_prefix(self, tenant: str, key: str) -> PrefixRecord | None:
        with self._read() as db:
            row = db.execute("SELECT record FROM prefixes WHERE tenant = ? AND key = ?", (tenant, key)).fetchone()
        return None if row is None else PrefixRecord.model_validate_json(row[0])

    def _write_prefix(self, tenant: str, record: PrefixRecord, *, expected: int | None) -> None:
        body, writing = record.model_dump_json(), int(record.writer is not None)
        with self._write() as db:
            if expected is None:
                done = db.execute(
                    "INSERT OR IGNORE INTO prefixes (tenant, key, version, writing, record) VALUES (?, ?, ?, ?, ?)",
                    (tenant, record.key, record.version, writing, body),
                ).rowcount
            else:
                done = db.execute(
                    "UPDATE prefixes SET version = ?, writing = ?, record = ? WHERE tenant = ? AND key = ? AND version = ?",
                    (record.version, writing, body, tenant, record.key, expected),
                ).rowcount
            if not done:
                raise Refused()

    def _writing_prefixes(self, tenant: str | None) -> list[tuple[str, PrefixRecord]]:
        where, args = ("writing = 1", ()) if tenant is None else ("writing = 1 AND tenant = ?", (tenant,))
        with self._read() as db:
            rows = db.execute(f"SELECT tenant, record FROM prefixes WHERE {where}", args).fetchall()
        return [(t, PrefixRecord.model_validate_json(body)) for t, body in rows]
