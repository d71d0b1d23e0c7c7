"""Schedules' use cases on both stores: adding checks each field before anything is kept;
a firing delivered twice (or by racing deliveries) starts one run; each overlap policy;
pause and resume; catch-up after a `serve` that was down; a held firing starting once its
run ends; and `tick` at three times across Berlin's change to summer time."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from api_calls import RecordingDrives
from helpers import FIXTURES, ServicesOn

from laneflow.domain.errors import InvalidInput, NotFound
from laneflow.domain.records import RunStatus
from laneflow.domain.schedules import Outcome, ScheduleNotFound, ScheduleState
from laneflow.ports import Services
from laneflow.usecases import schedules as uc
from laneflow.usecases.fire_schedule import fire, firing_run_id, tick
from laneflow.usecases.stop import stop_run
from laneflow.wiring import local_engine

UTC = dt.UTC
TENANT = "local"
CONTROL = str(FIXTURES / "ws_control")  # approval parks (its run stays active); rescue completes
OK = str(FIXTURES / "ws_ok")  # brief: a flow with an input schema


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def svc(on: ServicesOn) -> Services:
    services = on()
    services.drives = RecordingDrives()  # runs stay queued: active, for the overlap policies
    return services


def add(svc: Services, expression: str = "rate(15 minutes)", *, now: str = "2026-03-01T10:00:00Z", **fields: Any) -> Any:
    where = fields.pop("where", CONTROL)
    body = {"workspace": "ws_control", "flow": "approval", "expression": expression, **fields}
    return uc.add_schedule(svc, TENANT, uc.AddSchedule.model_validate(body), where=where, now=at(now))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"expression": "cron(0 7 * * * *)"}, "expression"),
        ({"expression": "every morning"}, "expression"),
        ({"expression": "at(2020-01-01T00:00:00)"}, "expression"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"flow": "no-such-flow"}, "flow"),
        ({"where": OK, "flow": "brief", "input": {"topics": "not a list"}}, "input"),
        ({"where": OK, "flow": "brief", "input": {}}, "input"),
    ],
)
def test_adding_refuses_each_bad_field_by_name_and_keeps_nothing(svc: Services, fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        add(svc, **fields)
    assert refused.value.problems[0].field == field, refused.value
    assert svc.store.list_schedules(TENANT) == []


def test_a_firing_delivered_twice_starts_one_run_and_the_run_says_which_firing(svc: Services) -> None:
    s = add(svc)
    first = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    version = svc.store.get_schedule(TENANT, s.id).version
    again = fire(svc, TENANT, s.id, "2026-03-01T10:15:31Z")  # the same minute, delivered again
    assert svc.store.get_schedule(TENANT, s.id).version == version  # found, and nothing written
    assert first.firing.outcome == Outcome.started and not first.replayed
    assert again.replayed and again.run is not None and first.run is not None and again.run.id == first.run.id
    assert first.run.id == firing_run_id(TENANT, s.id, "2026-03-01T10:15:00Z")
    assert [run_id for _, run_id in svc.drives.started] == [first.run.id]  # type: ignore[union-attr]
    run = svc.store.get_run(TENANT, first.run.id)
    assert (run.schedule_id, run.scheduled_at) == (s.id, "2026-03-01T10:15:00Z")
    assert run.public()["schedule_id"] == s.id and run.public()["scheduled_at"] == "2026-03-01T10:15:00Z"
    record = svc.store.get_schedule(TENANT, s.id)
    assert [(f.outcome, f.run_id) for f in record.firings] == [(Outcome.started, first.run.id)]


def test_racing_deliveries_of_one_firing_make_one_run(svc: Services) -> None:
    s = add(svc, overlap="allow")
    barrier = threading.Barrier(6)
    got: list[Any] = []

    def deliver() -> None:
        barrier.wait()
        got.append(fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z"))

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 6 and len({f.firing.run_id for f in got}) == 1
    assert [f.replayed for f in got].count(False) == 1
    assert len(svc.drives.started) == 1  # type: ignore[union-attr]
    assert len(svc.store.list_runs(TENANT)) == 1


def test_skip_records_a_skipped_firing_while_the_last_run_is_active(svc: Services) -> None:
    s = add(svc)  # overlap: skip, the default
    first = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    skipped = fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z")
    assert skipped.firing.outcome == Outcome.skipped and skipped.run is None
    assert "still active" in (skipped.firing.reason or "") and skipped.firing.run_id == first.firing.run_id
    assert len(svc.store.list_runs(TENANT)) == 1
    assert fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z").replayed  # answered as recorded
    assert first.run is not None
    stop_run(svc, TENANT, first.run.id)  # the last run ends: the next firing starts
    assert fire(svc, TENANT, s.id, "2026-03-01T10:45:00Z").firing.outcome == Outcome.started
    assert len(svc.store.list_runs(TENANT)) == 2


def test_allow_starts_every_firing_whatever_runs(svc: Services) -> None:
    s = add(svc, overlap="allow")
    outcomes = [fire(svc, TENANT, s.id, f"2026-03-01T10:{m}:00Z").firing.outcome for m in ("15", "30", "45")]
    assert outcomes == [Outcome.started] * 3
    assert {r.status for r in svc.store.list_runs(TENANT)} == {RunStatus.queued}
    assert len(svc.store.list_runs(TENANT)) == 3


def test_buffer_one_holds_one_firing_and_starts_it_when_the_last_run_ends(svc: Services) -> None:
    s = add(svc, overlap="buffer-one")
    first = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    held = fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z")
    extra = fire(svc, TENANT, s.id, "2026-03-01T10:45:00Z")
    assert (held.firing.outcome, extra.firing.outcome) == (Outcome.buffered, Outcome.skipped)
    assert "already held" in (extra.firing.reason or "")
    assert svc.store.get_schedule(TENANT, s.id).buffered == "2026-03-01T10:30:00Z"
    assert first.run is not None
    stop_run(svc, TENANT, first.run.id)  # its end lets the held firing start
    record = svc.store.get_schedule(TENANT, s.id)
    assert record.buffered is None
    started = record.firing("2026-03-01T10:30:00Z")
    assert started is not None and started.outcome == Outcome.started
    assert started.run_id == firing_run_id(TENANT, s.id, "2026-03-01T10:30:00Z") == record.last_run
    assert len(svc.store.list_runs(TENANT)) == 2
    assert [r.id for r in uc.runs_of_schedule(svc, TENANT, s.id).runs] == [started.run_id, first.run.id]


def test_a_paused_schedule_fires_nothing_and_resumed_fires_only_what_comes_after(svc: Services) -> None:
    s = add(svc)
    paused = uc.set_state(svc, TENANT, s.id, ScheduleState.paused)
    assert paused.state == ScheduleState.paused and paused.next_firings(at("2026-03-01T10:00:00Z")) == []
    assert tick(svc, at("2026-03-01T10:15:10Z")) == []
    assert fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z").firing.outcome == Outcome.skipped  # a late delivery
    resumed = uc.set_state(svc, TENANT, s.id, ScheduleState.enabled)
    assert resumed.state == ScheduleState.enabled and resumed.through is not None
    now = at(resumed.through)
    assert tick(svc, now) == []  # nothing of what came while paused
    assert svc.store.list_runs(TENANT) == []


def test_catch_up_fires_the_last_missed_firing_within_the_window_and_records_the_others_missed(svc: Services) -> None:
    s = add(svc, expression="rate(15 minutes)", now="2026-03-01T10:00:00Z")
    [first] = tick(svc, at("2026-03-01T10:15:05Z"))
    assert first.firing.outcome == Outcome.started
    # Down from 10:16 to 11:40: 11:30 fires, 10:30 to 11:15 are missed.
    came = tick(svc, at("2026-03-01T11:40:00Z"))
    assert [(f.firing.scheduled_at[11:16], f.firing.outcome) for f in came] == [
        ("10:30", Outcome.missed),
        ("10:45", Outcome.missed),
        ("11:00", Outcome.missed),
        ("11:15", Outcome.missed),
        ("11:30", Outcome.skipped),  # the 10:15 run is still active (overlap: skip)
    ]
    assert first.run is not None
    stop_run(svc, TENANT, first.run.id)
    # Down past the catch-up window: nothing fires, all missed.
    late = tick(svc, at("2026-03-01T13:20:00Z"), catchup_s=240)
    assert {f.firing.outcome for f in late} == {Outcome.missed} and len(late) == 7
    assert tick(svc, at("2026-03-01T13:20:00Z")) == []  # looked at once
    record = svc.store.get_schedule(TENANT, s.id)
    assert record.firings[0].scheduled_at == "2026-03-01T13:15:00Z" and record.through == "2026-03-01T13:15:00Z"
    assert len(svc.store.list_runs(TENANT)) == 1


def test_tick_across_berlins_change_to_summer_time_starts_exactly_the_firings_due(svc: Services) -> None:
    # 2027-03-28: Berlin's 02:00 becomes 03:00. A fires at 02:30 (none that night), B at 03:00.
    svc.drives = RecordingDrives(local_engine(svc))  # each run is driven to its end as it starts
    a = add(svc, "cron(30 2 * * ? *)", timezone="Europe/Berlin", flow="rescue", now="2027-03-20T12:00:00Z")
    b = add(svc, "cron(0 3 * * ? *)", timezone="Europe/Berlin", flow="rescue", now="2027-03-20T12:00:00Z")
    started = []
    for when in ("2027-03-27T01:31:00Z", "2027-03-28T01:31:00Z", "2027-03-29T00:31:00Z"):
        started += [(f.schedule_id, f.firing.scheduled_at) for f in tick(svc, at(when)) if f.firing.outcome == Outcome.started]
    assert started == [
        (a.id, "2027-03-27T01:30:00Z"),  # 02:30 CET
        (b.id, "2027-03-28T01:00:00Z"),  # 03:00 CEST: the hour after the change
        (a.id, "2027-03-29T00:30:00Z"),  # 02:30 CEST
    ]
    runs = {(r.schedule_id, r.scheduled_at): r.status for r in svc.store.list_runs(TENANT)}
    assert runs == dict.fromkeys(started, RunStatus.completed)


def test_removing_a_schedule_stops_its_firings_and_keeps_its_runs(svc: Services) -> None:
    s = add(svc)
    fired = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    assert uc.remove_schedule(svc, TENANT, s.id).id == s.id
    with pytest.raises(ScheduleNotFound):
        fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z")
    assert tick(svc, at("2026-03-01T10:30:10Z")) == []
    assert fired.run is not None and svc.store.get_run(TENANT, fired.run.id).schedule_id == s.id
    with pytest.raises(ScheduleNotFound):
        uc.remove_schedule(svc, TENANT, s.id)


def test_a_firing_whose_run_cannot_be_made_is_recorded_failed_with_why(svc: Services, tmp_path: Any) -> None:
    import shutil

    copy = tmp_path / "ws"
    shutil.copytree(CONTROL, copy)
    s = add(svc, where=str(copy))
    (copy / "flows" / "approval.yaml").unlink()  # the flow is gone by the time it fires
    failed = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    assert failed.firing.outcome == Outcome.failed and "approval" in (failed.firing.reason or "")
    assert svc.store.list_runs(TENANT) == []


def test_the_runs_of_a_schedule_page_newest_first(svc: Services) -> None:
    s = add(svc, overlap="allow")
    ids = [fire(svc, TENANT, s.id, f"2026-03-01T1{h}:00:00Z").firing.run_id for h in range(5)]
    page = uc.runs_of_schedule(svc, TENANT, s.id, limit=2)
    assert [r.id for r in page.runs] == ids[::-1][:2] and page.next == ids[3]
    rest = uc.runs_of_schedule(svc, TENANT, s.id, limit=5, before=page.next)
    assert [r.id for r in rest.runs] == ids[::-1][2:] and rest.next is None
    other = add(svc, overlap="allow")
    with pytest.raises(NotFound):
        uc.runs_of_schedule(svc, TENANT, other.id, before=ids[0])


def test_a_held_run_ends_through_the_engine_and_its_schedule_fires_the_held_firing(svc: Services) -> None:
    s = add(svc, overlap="buffer-one", flow="rescue")
    first = fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")
    fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z")
    assert first.run is not None
    ended = local_engine(svc).drive(TENANT, first.run.id, tick_s=0.02)  # EndRun tells the schedule
    assert svc.store.get_run(TENANT, first.run.id).status == RunStatus.completed, ended
    assert svc.store.get_schedule(TENANT, s.id).last_run == firing_run_id(TENANT, s.id, "2026-03-01T10:30:00Z")


def test_a_firing_recorded_before_a_look_is_answered_as_recorded_and_the_look_moves_on(svc: Services) -> None:
    s = add(svc)
    fire(svc, TENANT, s.id, "2026-03-01T10:15:00Z")  # delivered by itself (Scheduler, a test)
    fire(svc, TENANT, s.id, "2026-03-01T10:30:00Z")  # skipped: the 10:15 run is active
    [looked] = tick(svc, at("2026-03-01T10:30:20Z"))
    assert looked.replayed and looked.firing.outcome == Outcome.skipped
    assert svc.store.get_schedule(TENANT, s.id).through == "2026-03-01T10:30:00Z"
    assert tick(svc, at("2026-03-01T10:30:40Z")) == []
