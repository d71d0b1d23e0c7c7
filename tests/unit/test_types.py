"""Types over strings: a trace line's type and a lane's key read and write as the same text
they always did."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.store import open_store
from laneflow.domain.lanes import gate_key
from laneflow.domain.messages import LaneKey
from laneflow.domain.records import Event, EventType, Run, Step

# Every type an earlier version wrote into a step's trace.
WRITTEN_BEFORE = ("info", "attempt", "tool", "gate", "judge", "warning", "error")


# --------------------------------------------------------------------------- event types


@pytest.mark.parametrize("text", WRITTEN_BEFORE)
def test_a_stored_event_type_reads_back_as_its_member_and_writes_as_the_same_text(text: Any) -> None:
    event = Event.model_validate({"t": "2026-01-01T00:00:00.000Z", "type": text, "text": "x"})
    assert event.type is EventType(text)
    assert event.model_dump(mode="json")["type"] == text


def test_an_event_without_a_type_is_info() -> None:
    assert Event(text="approved by a person").type is EventType.info


def test_an_event_type_nobody_wrote_is_refused() -> None:
    with pytest.raises(ValueError):
        Event(type="handoff!", text="x")  # type: ignore[arg-type]


def test_old_event_rows_in_sqlite_still_read_and_new_ones_keep_the_text(tmp_path: Path) -> None:
    # Given a run whose events table holds rows as an earlier version wrote them (plain text)
    path = tmp_path / "laneflow.db"
    store = open_store(f"sqlite:///{path}")
    try:
        run = Run(id="run-old", tenant="local", workspace="ws", flow="f", steps=[Step(index=0, group=0, agent="a")])
        store.create_run(run)
        db = sqlite3.connect(path)
        with db:
            for n, text in enumerate(WRITTEN_BEFORE):
                db.execute(
                    "INSERT INTO events (tenant, run_id, idx, t, type, text) VALUES (?, ?, ?, ?, ?, ?)",
                    ("local", "run-old", 0, f"2026-01-01T00:00:0{n}.000Z", text, f"line {n}"),
                )
        # When it is read, and a new line is written through the store
        store.add_event("local", "run-old", 0, Event(type=EventType.gate, text="new"))
        events = store.get_step("local", "run-old", 0, detail=True).events
        stored = [row[0] for row in db.execute("SELECT type FROM events ORDER BY seq")]
        db.close()
    finally:
        store.close()
    # Then every old line has its member, and the new one is stored as the same text
    assert [e.type for e in events] == [EventType(t) for t in WRITTEN_BEFORE] + [EventType.gate]
    assert stored == [*WRITTEN_BEFORE, "gate"]


# --------------------------------------------------------------------------- lane keys


def test_a_lane_key_is_written_agent_at_model_and_parsed_back() -> None:
    key = LaneKey("writer", "claude-haiku-4-5")
    assert str(key) == "writer@claude-haiku-4-5"
    assert LaneKey.parse(str(key)) == key


def test_a_model_name_with_an_at_sign_stays_whole() -> None:
    key = LaneKey.parse("writer@claude-sonnet-4@20250514")
    assert (key.agent, key.model) == ("writer", "claude-sonnet-4@20250514")


def test_the_gate_key_is_the_same_for_the_key_and_its_text() -> None:
    key = LaneKey("writer", "stub")
    assert gate_key(1, 2, key) == gate_key(1, 2, "writer@stub") == "g1c2:writer@stub"
