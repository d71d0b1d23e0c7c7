"""The SQLite store's statements on a step's path find their rows by key, never by scanning
a run's rows (a search by the key's run prefix alone reads them all): a claim once searched the run's attempts for its op_id, so every claim of a
10,000-step run was slower than the one before (1.3 ms at the end against 0.18 at the start)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.records import AttemptRef, AttemptStatus, Event, Run, Step, StepChanges, StepStatus, utcnow

# Statements that read a run's rows on purpose (a run's record, its outline, its list).
WHOLE_RUN = ("GROUP BY grp", "FROM runs WHERE tenant = ? ORDER BY", "WHERE status = 'running'", "WHERE status = 'pending'")


def test_a_steps_life_on_sqlite_reads_by_key_and_scans_no_table(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "plans.db")
    run = Run(
        id=f"run-{uuid.uuid4().hex[:8]}",
        tenant="acme",
        workspace="ws",
        flow="f",
        steps=[Step(index=i, group=0, agent="a", item=str(i)) for i in range(3)],
    )
    store.create_run(run)
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    t, r = run.tenant, run.id
    op = "exec-1/RunStep/0/0"
    store.journal_begin(t, r, op, 1)
    attempt = store.claim_attempt(t, r, 1, token=uuid.uuid4().hex, started_at=utcnow(), op_id=op)
    store.journal_settle(t, r, op)
    store.add_event(t, r, 1, Event(text="working"))
    store.get_step(t, r, 1, detail=True)
    store.list_attempts(t, r, 1)
    store.get_step_status(t, r, 1)
    store.end_attempt(
        AttemptRef.of(t, attempt), AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, result="ok")
    )
    store._conn.set_trace_callback(None)

    selects = {s for s in statements if s.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE"))}
    assert len(selects) >= 5, statements
    db = sqlite3.connect(tmp_path / "plans.db")
    scans = []
    for sql in selects:
        plan = " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
        by_run_only = "run_id=?)" in plan  # a key search that stops at the run: all its rows are read
        if ("SCAN" in plan or by_run_only) and not any(w in sql for w in WHOLE_RUN):
            scans.append((sql[:160], plan))
    assert not scans, scans
