"""The embedded store's handoffs, warm gates and inboxes (peers, ask): their primitives over
the `handoffs`, `gates`, `notes` and `observed` tables. Who passes a gate and who is handed
back is laneflow.domain.gate's to say; this keeps the rendezvous exact by deciding inside
one write transaction."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from typing import Any

from laneflow.adapters.store.encoding import dumps
from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.sqlite_db import SqliteDatabase
from laneflow.domain.gate import GateClaim, GatePass, GateWaiter, hand_back, lets_pass
from laneflow.domain.inbox import Note
from laneflow.domain.records import AttemptRef, utcnow


class SqliteGatesAndInboxes(SqliteDatabase):
    """The primitives of handoffs, gates and inboxes."""

    def _read_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        with self._read() as db:
            row = db.execute(
                "SELECT body FROM handoffs WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
        return None if row is None else row[0]

    def _write_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO handoffs (tenant, run_id, key, body) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET body = excluded.body",
                (tenant, run_id, key, text),
            )

    def _gate_wait(self, tenant: str, run_id: str, key: str, waiter: GateWaiter) -> GatePass | None:
        select = "SELECT opened_at, ended_at, note, tokens FROM gates WHERE tenant = ? AND run_id = ? AND key = ?"
        with self._read() as db:  # most siblings arrive after the lead's reply began: no write
            row = db.execute(select, (tenant, run_id, key)).fetchone()
        if _passes(row, waiter):
            return GatePass(note=row[2])
        with self._write() as db:  # re-checked inside the write: the rendezvous stays exact
            row = db.execute(select, (tenant, run_id, key)).fetchone()
            if _passes(row, waiter):
                return GatePass(note=row[2])
            kept = [_waiter(t) for t in json.loads(row[3])] if row else []
            db.execute(
                "INSERT INTO gates (tenant, run_id, key, opened_at, tokens) VALUES (?, ?, ?, NULL, ?)"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET tokens = excluded.tokens",
                (tenant, run_id, key, _tokens([*kept, waiter])),
            )
            return None

    def _gate_open(self, tenant: str, run_id: str, key: str, *, lead_ended: bool, note: str | None) -> list[GateWaiter]:
        with self._write() as db:
            row = db.execute(
                "SELECT tokens FROM gates WHERE tenant = ? AND run_id = ? AND key = ?", (tenant, run_id, key)
            ).fetchone()
            handed, left = hand_back([_waiter(t) for t in json.loads(row[0])] if row else [], lead_ended=lead_ended)
            now = utcnow()
            db.execute(
                "INSERT INTO gates (tenant, run_id, key, opened_at, ended_at, note, tokens) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (tenant, run_id, key) DO UPDATE SET opened_at = coalesce(opened_at, excluded.opened_at),"
                " ended_at = coalesce(ended_at, excluded.ended_at), note = coalesce(note, excluded.note), tokens = excluded.tokens",
                (tenant, run_id, key, now, now if lead_ended else None, note, _tokens(left)),
            )
            return handed

    def _gate_claim(self, tenant: str, run_id: str, key: str) -> GateClaim:
        select = "SELECT opened_at, ended_at FROM gates WHERE tenant = ? AND run_id = ? AND key = ?"
        with self._read() as db:  # once made, a gate is only read: no write
            row = db.execute(select, (tenant, run_id, key)).fetchone()
        if row is None:
            with self._write() as db:
                made = db.execute(
                    "INSERT INTO gates (tenant, run_id, key, opened_at, tokens) VALUES (?, ?, ?, NULL, '[]')"
                    " ON CONFLICT (tenant, run_id, key) DO NOTHING",
                    (tenant, run_id, key),
                ).rowcount
                if made:
                    return "lead"
                row = db.execute(select, (tenant, run_id, key)).fetchone()
        return "open" if row[0] or row[1] else "wait"

    def _read_notes(self, tenant: str, run_id: str, note_id: str | None = None) -> list[Note]:
        one, args = ("", (tenant, run_id)) if note_id is None else (" AND id = ?", (tenant, run_id, note_id))
        with self._read() as db:
            rows = db.execute(f"SELECT body FROM notes WHERE tenant = ? AND run_id = ?{one}", args).fetchall()
        return [Note.model_validate_json(body) for (body,) in rows]

    def _read_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        out: dict[int, list[str]] = defaultdict(list)
        with self._read() as db:
            rows = db.execute(
                "SELECT n, id FROM observed WHERE tenant = ? AND run_id = ? AND idx = ? ORDER BY seq", (tenant, run_id, index)
            ).fetchall()
        for n, note_id in rows:
            out[n].append(note_id)
        return dict(out)

    def _open_questions(self, tenant: str | None) -> list[tuple[str, Note]]:
        where, args = ("status = 'open'", ()) if tenant is None else ("status = 'open' AND tenant = ?", (tenant,))
        with self._read() as db:
            rows = db.execute(f"SELECT tenant, body FROM notes WHERE {where}", args).fetchall()
        return [(t, Note.model_validate_json(body)) for t, body in rows]

    def _write_note(self, tenant: str, note: Note, *, replaces_open: bool) -> None:
        key, status = (tenant, note.run_id, note.id), note.status.value if note.status else None
        with self._write() as db:
            if not replaces_open:
                try:
                    db.execute(
                        "INSERT INTO notes (tenant, run_id, id, to_idx, status, body) VALUES (?, ?, ?, ?, ?, ?)",
                        (*key, note.to_index, status, note.model_dump_json()),
                    )
                except sqlite3.IntegrityError:
                    raise Refused() from None
                return
            row = db.execute("SELECT status, body FROM notes WHERE tenant = ? AND run_id = ? AND id = ?", key).fetchone()
            if row is None or row[0] != "open":
                raise Refused(None if row is None else Note.model_validate_json(row[1]))
            db.execute(
                "UPDATE notes SET status = ?, body = ? WHERE tenant = ? AND run_id = ? AND id = ?",
                (status, note.model_dump_json(), *key),
            )

    @staticmethod
    def _insert_observed(db: sqlite3.Connection, ref: AttemptRef, ids: list[str]) -> None:
        """Insert the ids attempt `ref` observed (its fence is the caller's)."""
        db.executemany(
            "INSERT INTO observed (tenant, run_id, idx, n, id) VALUES (?, ?, ?, ?, ?)",
            [(ref.tenant, ref.run_id, ref.index, ref.n, note_id) for note_id in ids],
        )


def _passes(row: tuple[Any, ...] | None, waiter: GateWaiter) -> bool:
    """Whether a gate row (opened_at, ended_at, ...) lets this waiter start."""
    return row is not None and lets_pass(waiter, opened=row[0] is not None, lead_ended=row[1] is not None)


def _tokens(kept: list[GateWaiter]) -> str:
    """The waiters a gate row keeps, as its `tokens` column holds them."""
    return dumps([{"token": w.token, "index": w.index, "until_lead_ends": w.until_lead_ends} for w in kept])


def _waiter(kept: Any) -> GateWaiter:
    """A kept token as the gate row holds it (an older row kept the bare token)."""
    if isinstance(kept, str):
        return GateWaiter(token=kept)
    return GateWaiter(token=kept["token"], index=kept.get("index"), until_lead_ends=bool(kept.get("until_lead_ends")))
