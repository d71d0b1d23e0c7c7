"""Schedules on every store: made once, read back whole, listed by tenant and by what is
enabled, firings recorded once each under racing deliveries, paused and resumed, removed,
and the runs each started firing made listed under the schedule."""

from __future__ import annotations

import threading

import pytest

from contract.store.backends import TENANT, new_run
from laneflow.adapters.store import Store
from laneflow.domain.errors import Conflict
from laneflow.domain.schedules import FIRINGS_KEPT, Firing, Outcome, Schedule, ScheduleNotFound, ScheduleState, new_schedule_id
from laneflow.domain.tenants import TenantInvalid


def schedule(tenant: str = TENANT, **fields: object) -> Schedule:
    base: dict[str, object] = {
        "id": new_schedule_id(),
        "tenant": tenant,
        "workspace": "newsroom",
        "flow": "brief",
        "expression": "rate(15 minutes)",
        "input": {"topics": ["tides"]},
        "workspace_uri": "/work/ws/newsroom",
    }
    return Schedule.model_validate(base | fields)


def stamp(minute: int) -> str:
    return f"2026-03-01T{10 + minute // 60:02d}:{minute % 60:02d}:00Z"


def test_a_schedule_is_written_once_and_read_back_whole(store: Store) -> None:
    s = schedule(timezone="Europe/Berlin", overlap="buffer-one", model="stub")
    store.create_schedule(s)
    assert store.get_schedule(TENANT, s.id) == s  # where its workspace is, too
    with pytest.raises(Conflict, match="exists"):
        store.create_schedule(s.model_copy(update={"flow": "other"}))
    assert store.get_schedule(TENANT, s.id).flow == "brief"


def test_another_tenants_schedule_is_not_found_and_not_listed(store: Store) -> None:
    mine, theirs = schedule(), schedule(tenant="acme")
    store.create_schedule(mine)
    store.create_schedule(theirs)
    with pytest.raises(ScheduleNotFound):
        store.get_schedule("acme", mine.id)
    assert [s.id for s in store.list_schedules(TENANT)] == [mine.id]
    assert [s.id for s in store.list_enabled_schedules("acme")] == [theirs.id]
    assert {s.id for s in store.list_enabled_schedules()} == {mine.id, theirs.id}
    with pytest.raises(ScheduleNotFound):
        store.record_firing("acme", mine.id, Firing(scheduled_at=stamp(15), outcome=Outcome.skipped))
    with pytest.raises(ScheduleNotFound):
        store.delete_schedule("acme", mine.id)
    with pytest.raises(TenantInvalid):
        store.list_schedules("no such/tenant")


def test_the_tenants_schedules_are_listed_oldest_first_and_only_enabled_ones_are_live(store: Store) -> None:
    made = [schedule(created_at=f"2026-03-01T10:0{k}:00.000Z") for k in range(3)]
    for s in reversed(made):
        store.create_schedule(s)
    assert [s.id for s in store.list_schedules(TENANT)] == [s.id for s in made]
    paused = store.set_schedule_state(TENANT, made[1].id, ScheduleState.paused, at="2026-03-01T11:00:00Z")
    assert paused.state == ScheduleState.paused and paused.version == made[1].version + 1
    assert [s.id for s in store.list_enabled_schedules(TENANT)] == [made[0].id, made[2].id]
    resumed = store.set_schedule_state(TENANT, made[1].id, ScheduleState.enabled, at="2026-03-01T12:07:00Z")
    assert resumed.state == ScheduleState.enabled and resumed.through == "2026-03-01T12:07:00Z"
    assert [s.id for s in store.list_enabled_schedules()] == [s.id for s in made]


def test_a_firing_is_recorded_once_and_a_started_one_lists_its_run(store: Store) -> None:
    s = schedule()
    store.create_schedule(s)
    run = new_run(store)
    first = store.record_firing(
        TENANT, s.id, Firing(scheduled_at=stamp(15), outcome=Outcome.started, run_id=run.id), through=stamp(15)
    )
    assert first.last_run == run.id and first.through == stamp(15) and len(first.firings) == 1
    again = store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(15), outcome=Outcome.started, run_id=run.id))
    assert again.firings == first.firings and again.last_run == run.id
    store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(30), outcome=Outcome.skipped, reason="busy"), through=stamp(30))
    got = store.get_schedule(TENANT, s.id)
    assert [(f.scheduled_at, f.outcome) for f in got.firings] == [(stamp(30), Outcome.skipped), (stamp(15), Outcome.started)]
    assert got.firings[0].reason == "busy" and got.through == stamp(30)
    listed = store.list_schedule_runs(TENANT, s.id)
    assert [(at, r.id) for at, r in listed] == [(stamp(15), run.id)] and listed[0][1].steps == []
    assert store.list_schedule_runs("acme", s.id) == [] and store.list_schedule_runs(TENANT, "sch-none") == []


def test_racing_deliveries_of_firings_each_land_once(store: Store) -> None:
    s = schedule(overlap="allow")
    store.create_schedule(s)
    runs = [new_run(store, steps=1) for _ in range(4)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def deliver(k: int) -> None:
        barrier.wait()
        try:
            firing = Firing(scheduled_at=stamp(15 * (k % 4 + 1)), outcome=Outcome.started, run_id=runs[k % 4].id)
            store.record_firing(TENANT, s.id, firing, through=firing.scheduled_at)
        except BaseException as error:  # the test reports it
            errors.append(error)

    threads = [threading.Thread(target=deliver, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    got = store.get_schedule(TENANT, s.id)
    assert [f.scheduled_at for f in got.firings] == [stamp(60), stamp(45), stamp(30), stamp(15)]
    assert got.last_run == runs[3].id and got.through == stamp(60)
    assert got.version == s.version + len({*range(8)})  # every write landed, none twice over another
    assert [r.id for _, r in store.list_schedule_runs(TENANT, s.id)] == [r.id for r in reversed(runs)]


def test_the_runs_of_a_schedule_come_a_page_at_a_time_newest_first(store: Store) -> None:
    s = schedule()
    store.create_schedule(s)
    runs = [new_run(store, steps=1) for _ in range(5)]
    for k, run in enumerate(runs):
        store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(15 * (k + 1)), outcome=Outcome.started, run_id=run.id))
    page = store.list_schedule_runs(TENANT, s.id, limit=2)
    assert [r.id for _, r in page] == [runs[4].id, runs[3].id]
    rest = store.list_schedule_runs(TENANT, s.id, limit=10, before=page[-1][0])
    assert [r.id for _, r in rest] == [runs[2].id, runs[1].id, runs[0].id]


def test_the_record_keeps_its_latest_firings(store: Store) -> None:
    s = schedule()
    store.create_schedule(s)
    for k in range(FIRINGS_KEPT + 5):
        store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(k), outcome=Outcome.missed, reason="down"))
    got = store.get_schedule(TENANT, s.id)
    assert len(got.firings) == FIRINGS_KEPT and got.firings[0].scheduled_at == stamp(FIRINGS_KEPT + 4)


def test_a_removed_schedule_is_gone_but_its_runs_stay_listed(store: Store) -> None:
    s = schedule()
    store.create_schedule(s)
    run = new_run(store)
    store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(15), outcome=Outcome.started, run_id=run.id))
    removed = store.delete_schedule(TENANT, s.id)
    assert removed.id == s.id and removed.last_run == run.id
    with pytest.raises(ScheduleNotFound):
        store.get_schedule(TENANT, s.id)
    with pytest.raises(ScheduleNotFound):
        store.delete_schedule(TENANT, s.id)
    assert store.list_schedules(TENANT) == [] and store.list_enabled_schedules() == []
    assert [r.id for _, r in store.list_schedule_runs(TENANT, s.id)] == [run.id]
    assert store.get_run(TENANT, run.id).id == run.id


def test_a_schedules_input_and_a_firings_reason_are_masked(store: Store) -> None:
    secret = "sk-ant-fake-schedule-0123456789"
    store.redactor.add("KEY", secret)
    s = schedule(input={"token": secret})
    store.create_schedule(s)
    store.record_firing(TENANT, s.id, Firing(scheduled_at=stamp(15), outcome=Outcome.failed, reason=f"bad {secret}"))
    got = store.get_schedule(TENANT, s.id)
    assert got.input == {"token": "[KEY]"} and got.firings[0].reason == "bad [KEY]"
