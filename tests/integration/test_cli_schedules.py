"""`laneflow schedule ...` as a person uses it, and `serve`'s loop: bad input is exit 2
naming the field with nothing kept; `list` shows each schedule's next three firings on its
zone's clock; `tick --at` at three times across Berlin's change to summer time starts
exactly the runs due (driven to their end); a `serve` that was down fires each schedule's
last missed firing within its catch-up and records the others missed."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest
from api_calls import RecordingDrives
from helpers import FIXTURES

from laneflow.adapters.store import open_store
from laneflow.domain.schedules import Outcome
from laneflow.entrypoints.cli import main
from laneflow.entrypoints.serve_schedules import Scheduling
from laneflow.settings import Settings
from laneflow.usecases.schedules import AddSchedule, add_schedule
from laneflow.wiring import for_store

CONTROL = FIXTURES / "ws_control"


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_bad_expression_zone_flow_or_input_is_exit_2_naming_it_and_nothing_is_kept(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, said in (
        (["cron(0 7 * * * *)"], "laneflow: expression: "),
        (["rate(15 minutes)", "--timezone", "Mars/Base"], "laneflow: timezone: "),
        (["rate(15 minutes)", "--input", "[1, 2]"], "laneflow: --input: "),
        (["rate(15 minutes)", "--input", "{bad"], "laneflow: --input: "),
    ):
        code, out, err = cli(capsys, "schedule", "add", str(CONTROL), "approval", *args, "--store", store)
        assert code == 2 and out == "" and err.startswith(said), (args, err)
    code, _, err = cli(capsys, "schedule", "add", str(CONTROL), "nope", "rate(15 minutes)", "--store", store)
    assert code == 2 and err.startswith("laneflow: flow: no flow 'nope'")
    code, _, err = cli(capsys, "schedule", "add", str(FIXTURES / "ws_ok"), "brief", "rate(15 minutes)", "--store", store)
    assert code == 2 and err.startswith("laneflow: input: ")
    assert cli(capsys, "schedule", "list", "--store", store, "--json")[1] == "[]\n"
    code, _, err = cli(capsys, "schedule", "pause", "sch-nope", "--store", store)
    assert code == 2 and "no schedule 'sch-nope'" in err


def test_list_shows_each_schedule_with_its_next_three_firings_on_its_zones_clock(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(
        capsys, "schedule", "add", str(CONTROL), "approval", "cron(0 7 ? * MON-FRI *)", "--timezone", "Europe/Berlin",
        "--overlap", "buffer-one", "--store", store, "--json",
    )  # fmt: skip
    made = json.loads(out)
    assert code == 0 and made["overlap"] == "buffer-one" and made["timezone"] == "Europe/Berlin"
    code, out, _ = cli(capsys, "schedule", "list", "--store", store)
    assert code == 0 and made["id"] in out and "Europe/Berlin" in out
    [line] = [line for line in out.splitlines() if line.strip().startswith("next:")]
    firings = line.split("next:")[1].split("last:")[0].strip().split(", ")
    assert firings == made["next"] and len(firings) == 3
    for when in firings:
        local = dt.datetime.fromisoformat(when)
        assert (local.hour, local.minute) == (7, 0) and local.isoweekday() <= 5
    code, out, _ = cli(capsys, "schedule", "pause", made["id"], "--store", store)
    assert code == 0 and out == f"{made['id']}: paused\n"
    listed = json.loads(cli(capsys, "schedule", "list", "--store", store, "--json")[1])
    assert listed[0]["state"] == "paused" and listed[0]["next"] == []
    assert cli(capsys, "schedule", "resume", made["id"], "--store", store)[0] == 0
    assert cli(capsys, "schedule", "remove", made["id"], "--store", store)[0] == 0
    assert json.loads(cli(capsys, "schedule", "list", "--store", store, "--json")[1]) == []


def test_tick_at_three_times_across_berlins_change_to_summer_time_starts_exactly_the_runs_due(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2027-03-28 02:00 in Berlin is 03:00: 02:30 does not come that night; 03:00 comes an hour early in UTC.
    ids = []
    for expression in ("cron(30 2 * * ? *)", "cron(0 3 * * ? *)"):
        args = ["schedule", "add", str(CONTROL), "rescue", expression, "--timezone", "Europe/Berlin", "--store", store, "--json"]
        ids.append(json.loads(cli(capsys, *args)[1])["id"])
    a, b = ids
    started = []
    for when in ("2027-03-27T01:31:00Z", "2027-03-28T01:31:00Z", "2027-03-29T00:31:00Z"):
        code, out, _ = cli(capsys, "schedule", "tick", "--at", when, "--store", store, "--step-workers", "0", "--json")
        assert code == 0
        started += [(f["schedule_id"], f["scheduled_at"]) for f in json.loads(out) if f["outcome"] == "started"]
    assert started == [(a, "2027-03-27T01:30:00Z"), (b, "2027-03-28T01:00:00Z"), (a, "2027-03-29T00:30:00Z")]
    runs = json.loads(cli(capsys, "runs", "--store", store, "--json")[1])
    assert {(r["schedule_id"], r["scheduled_at"]): r["status"] for r in runs} == dict.fromkeys(started, "completed")
    # The same tick again starts nothing.
    code, out, _ = cli(capsys, "schedule", "tick", "--at", "2027-03-29T00:31:00Z", "--store", store, "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = cli(capsys, "show", runs[0]["id"], "--store", store)
    assert f"schedule: {runs[0]['schedule_id']}, its firing at {runs[0]['scheduled_at']}" in out
    code, out, _ = cli(capsys, "schedule", "show", a, "--store", store)
    assert "2027-03-29T00:30:00Z  started" in out and "missed" in out  # the nights before it was looked at


def _services(store: str, tmp_path: Path) -> Any:
    svc = for_store(open_store(store), Settings(capture_dir=str(tmp_path / "captures")))
    svc.drives = RecordingDrives()
    return svc


def test_serve_back_after_being_down_fires_the_last_missed_firing_and_records_the_others_missed(
    store: str, tmp_path: Path
) -> None:
    svc = _services(store, tmp_path)
    now = dt.datetime.now(dt.UTC)
    made = add_schedule(
        svc,
        "local",
        AddSchedule(workspace="ws_control", flow="approval", expression="rate(15 minutes)"),
        where=str(CONTROL),
        now=now - dt.timedelta(hours=2, minutes=1),  # made two hours ago; serve was down since
    )
    scheduling = Scheduling(svc, catchup_s=3600, interval_s=0.05, quiet=True).start()
    try:
        deadline = time.monotonic() + 20
        while scheduling.looks < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        scheduling.stop()
    record = svc.store.get_schedule("local", made.id)
    outcomes = [f.outcome for f in record.firings]
    assert outcomes == [Outcome.started] + [Outcome.missed] * 7, outcomes
    assert len(svc.drives.started) == 1 and svc.drives.started[0][1] == record.last_run


def test_serve_fires_a_firing_as_it_comes(store: str, tmp_path: Path) -> None:
    svc = _services(store, tmp_path)
    made = add_schedule(
        svc,
        "local",
        AddSchedule(workspace="ws_control", flow="approval", expression="rate(1 minute)"),
        where=str(CONTROL),
        now=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=59.5),
    )
    scheduling = Scheduling(svc, interval_s=0.1, quiet=True).start()
    try:
        deadline = time.monotonic() + 20
        while not svc.drives.started and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        scheduling.stop()
    [(tenant, run_id)] = svc.drives.started
    run = svc.store.get_run(tenant, run_id)
    assert run.schedule_id == made.id and run.scheduled_at is not None
