"""Schedules' pure decisions: a firing's run key, overlap, what recording a firing does to
the record, pause and resume, and catch-up (what is due at a time)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.domain import schedules as sch
from laneflow.domain.schedules import Firing, Outcome, Overlap, Schedule, ScheduleState
from laneflow.usecases.start_run_idempotent import idempotent_run_id

UTC = dt.UTC


def schedule(**fields: object) -> Schedule:
    base: dict[str, object] = {
        "id": "sch-0123456789abcdef",
        "tenant": "local",
        "workspace": "newsroom",
        "flow": "brief",
        "expression": "rate(15 minutes)",
        "created_at": "2026-03-01T10:00:20.000Z",
    }
    return Schedule.model_validate(base | fields)


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_firings_run_id_comes_from_the_schedule_and_the_scheduled_time_only() -> None:
    key = sch.firing_key("sch-1", "2026-03-01T10:15:00Z")
    assert key == sch.firing_key("sch-1", sch.scheduled_text("2026-03-01T10:15:42.5Z"))  # the same minute
    assert idempotent_run_id("local", key) == idempotent_run_id("local", sch.firing_key("sch-1", "2026-03-01T10:15:00Z"))
    others = {
        idempotent_run_id("local", sch.firing_key("sch-2", "2026-03-01T10:15:00Z")),
        idempotent_run_id("local", sch.firing_key("sch-1", "2026-03-01T10:30:00Z")),
        idempotent_run_id("acme", key),
    }
    assert idempotent_run_id("local", key) not in others and len(others) == 3
    assert sch.scheduled_text("2026-03-01T11:15:00+01:00") == "2026-03-01T10:15:00Z"


@pytest.mark.parametrize(
    ("policy", "active", "buffered", "decision"),
    [
        (Overlap.skip, False, None, "start"),
        (Overlap.skip, True, None, "skip"),
        (Overlap.allow, True, None, "start"),
        (Overlap.allow, True, "2026-03-01T10:15:00Z", "start"),
        (Overlap.buffer_one, False, None, "start"),
        (Overlap.buffer_one, True, None, "buffer"),
        (Overlap.buffer_one, True, "2026-03-01T10:15:00Z", "skip"),  # one is held already
        (Overlap.buffer_one, True, "2026-03-01T10:30:00Z", "buffer"),  # that one, delivered again
    ],
)
def test_the_overlap_policy_decides_while_the_last_run_is_active(
    policy: Overlap, active: bool, buffered: str | None, decision: str
) -> None:
    got, why = sch.overlap(policy, last_run_active=active, buffered=buffered, scheduled_at="2026-03-01T10:30:00Z")
    assert got == decision
    assert (why is None) == (decision == "start")


def test_recording_a_firing_twice_keeps_one_and_a_start_replaces_what_held_it() -> None:
    s = schedule(overlap="buffer-one")
    held = sch.recorded(s, Firing(scheduled_at="2026-03-01T10:30:00Z", outcome=Outcome.buffered, run_id="run-a"))
    assert held.buffered == "2026-03-01T10:30:00Z" and held.version == s.version + 1
    again = sch.recorded(held, Firing(scheduled_at="2026-03-01T10:30:00Z", outcome=Outcome.buffered))
    assert again.firings == held.firings and again.buffered == held.buffered
    started = sch.recorded(again, Firing(scheduled_at="2026-03-01T10:30:00Z", outcome=Outcome.started, run_id="run-b"))
    assert [(f.outcome, f.run_id) for f in started.firings] == [(Outcome.started, "run-b")]
    assert started.last_run == "run-b" and started.buffered is None
    # A started firing delivered again stays the run it made.
    replay = sch.recorded(started, Firing(scheduled_at="2026-03-01T10:30:00Z", outcome=Outcome.skipped, reason="x"))
    assert replay.firings == started.firings and replay.last_run == "run-b"


def test_the_record_keeps_its_latest_firings_newest_first() -> None:
    s = schedule()
    for k in range(sch.FIRINGS_KEPT + 7):
        stamp = (at("2026-03-01T10:00:00Z") + dt.timedelta(minutes=15 * (k + 1))).strftime("%Y-%m-%dT%H:%M:%SZ")
        s = sch.recorded(s, Firing(scheduled_at=stamp, outcome=Outcome.started, run_id=f"run-{k}"))
    assert len(s.firings) == sch.FIRINGS_KEPT
    assert [f.run_id for f in s.firings[:2]] == [f"run-{sch.FIRINGS_KEPT + 6}", f"run-{sch.FIRINGS_KEPT + 5}"]
    assert s.last_run == f"run-{sch.FIRINGS_KEPT + 6}"
    # A late delivery of an older firing does not become the last run.
    late = sch.recorded(s, Firing(scheduled_at="2026-03-01T10:14:00Z", outcome=Outcome.started, run_id="run-late"))
    assert late.last_run == s.last_run


def test_due_fires_the_latest_firing_within_the_catchup_and_misses_the_others() -> None:
    s = schedule()  # rate(15 minutes) from 10:00
    nothing = sch.due(s, at("2026-03-01T10:14:00Z"))
    assert nothing.fire is None and nothing.missed == []
    one = sch.due(s, at("2026-03-01T10:15:30Z"))
    assert one.fire == "2026-03-01T10:15:00Z" and one.missed == [] and one.through == "2026-03-01T10:15:00Z"
    looked = s.model_copy(update={"through": one.through})
    assert sch.due(looked, at("2026-03-01T10:29:59Z")).fire is None
    # Down from 10:16 to 11:40: 11:30 fires, the five before it are missed.
    back = sch.due(looked, at("2026-03-01T11:40:00Z"))
    assert back.fire == "2026-03-01T11:30:00Z"
    assert back.missed == [f"2026-03-01T{t}:00Z" for t in ("11:15", "11:00", "10:45", "10:30")]
    # Back after the catch-up: nothing fires, everything is missed.
    late = sch.due(looked, at("2026-03-01T12:58:00Z"), catchup_s=600)
    assert late.fire is None and late.missed[0] == "2026-03-01T12:45:00Z" and late.through == "2026-03-01T12:45:00Z"
    assert sch.due(looked.model_copy(update={"state": ScheduleState.paused}), at("2026-03-01T11:40:00Z")) == sch.Due()


@settings(max_examples=100, deadline=None)
@given(down_minutes=st.integers(0, 60 * 24 * 30), catchup_minutes=st.integers(0, 180))
def test_due_never_fires_more_than_one_firing_and_misses_at_most_what_the_record_keeps(
    down_minutes: int, catchup_minutes: int
) -> None:
    s = schedule(expression="rate(1 minute)", through="2026-03-01T10:00:00Z")
    now = at("2026-03-01T10:00:00Z") + dt.timedelta(minutes=down_minutes, seconds=30)
    d = sch.due(s, now, catchup_s=catchup_minutes * 60)
    came = down_minutes
    if came == 0:
        assert d == sch.Due()
        return
    assert d.through == (now.replace(second=0)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (d.fire is not None) == (catchup_minutes * 60 >= 30)
    assert len(d.missed) == min(came - (d.fire is not None), sch.MISSED_LOOKED_AT + 1 - (d.fire is not None))
    assert d.fire not in d.missed


def test_resuming_looks_only_at_what_comes_after_it() -> None:
    s = schedule(through="2026-03-01T10:15:00Z")
    paused = sch.with_state(s, ScheduleState.paused, at("2026-03-01T10:20:00Z"))
    assert paused.state == ScheduleState.paused and paused.next_firings(at("2026-03-01T10:20:00Z")) == []
    resumed = sch.with_state(paused, ScheduleState.enabled, at("2026-03-01T12:07:00Z"))
    assert resumed.through == "2026-03-01T12:07:00Z"
    assert sch.due(resumed, at("2026-03-01T12:10:00Z")) == sch.Due()
    assert sch.due(resumed, at("2026-03-01T12:15:10Z")).fire == "2026-03-01T12:15:00Z"


def test_the_public_record_shows_the_next_firings_on_the_zones_clock_but_not_where_the_workspace_is() -> None:
    s = schedule(expression="cron(0 7 ? * MON-FRI *)", timezone="Europe/Berlin", workspace_uri="/home/me/ws")
    record = s.public(at("2026-03-27T12:00:00Z"))  # a Friday
    assert record["next"] == ["2026-03-30T07:00:00+02:00", "2026-03-31T07:00:00+02:00", "2026-04-01T07:00:00+02:00"]
    assert "workspace_uri" not in record and record["overlap"] == "skip" and record["state"] == "enabled"
