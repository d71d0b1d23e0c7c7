"""The viewer's schedules, in headless Chromium against a real `laneflow serve`: the list
shows each schedule with its next three firings on its zone's wall clock and what its last
firing did; a schedule's page lists the runs it started, each a link to the run's page,
which links back to the schedule; a paused schedule says so. Screenshots are left in
build/browser/ (`artefacts`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from laneflow.usecases.fire_schedule import fire
from laneflow_dev import browser as harness

pytestmark = pytest.mark.slow


def _local(iso: str) -> str:
    """The wall clock the viewer shows for a firing time (`Mon 30 Mar 07:00 (+02:00)`)."""
    when = dt.datetime.fromisoformat(iso)
    offset = iso[-6:]
    return f"{when.strftime('%a')} {when.day} {when.strftime('%b')} {when.strftime('%H:%M')}" + (
        "" if offset == "+00:00" else f" ({offset})"
    )


def test_the_schedules_list_shows_next_firings_and_links_each_schedule_to_its_runs(
    page: Any, served: harness.Served, artefacts: Path
) -> None:
    # Given two schedules, one of which fired twice (each firing a run) and one paused,
    weekday = served.post(
        "/schedules",
        {"workspace": "ws_control", "flow": "rescue", "expression": "cron(0 7 ? * MON-FRI *)", "timezone": "Europe/Berlin"},
    )
    hourly = served.post("/schedules", {"workspace": "ws_control", "flow": "approval", "expression": "rate(1 hour)"})
    served.post(f"/schedules/{hourly['id']}/pause")
    fired = []
    for at in ("2026-12-01T06:00:00Z", "2026-12-02T06:00:00Z"):  # each run ends before the next firing
        run_id = fire(served.svc, served.tenant, weekday["id"], at).firing.run_id
        assert run_id is not None
        served.wait(run_id, "completed", "failed")
        fired.append(run_id)

    # When a person opens the viewer's schedules,
    page.goto(served.url + "/")
    page.locator('[data-k="schedules-link"]').click()
    expect(page).to_have_title("laneflow schedules")
    row = page.locator(f'tr.schedule-row[data-schedule="{weekday["id"]}"]')
    expect(row).to_be_visible()

    # Then each schedule shows its next three firings on its zone's clock, and its last firing,
    for i, iso in enumerate(weekday["next"]):
        expect(row.locator(f'[data-k="next-{i}"]')).to_contain_text(_local(iso))
        assert "07:00" in _local(iso)
    expect(row.locator('[data-k="expression"]')).to_contain_text("cron(0 7 ? * MON-FRI *)")
    expect(row.locator('[data-k="expression"]')).to_contain_text("Europe/Berlin")
    expect(row.locator('[data-k="last"]')).to_contain_text("started")
    expect(row.locator('[data-k="last"] [data-k="firing-run"]')).to_have_text(fired[1])
    paused = page.locator(f'tr.schedule-row[data-schedule="{hourly["id"]}"]')
    expect(paused.locator('[data-k="state"]')).to_have_text("paused")
    expect(paused.locator('[data-k="next"]')).to_have_text("paused")
    page.screenshot(path=str(artefacts / "schedules.png"), full_page=True)

    # ...and its page lists the runs it started, newest first, each a link to the run.
    row.locator('[data-k="schedule"] a').click()
    expect(page.locator(f'.schedule[data-schedule="{weekday["id"]}"]')).to_be_visible()
    runs = page.locator('[data-k="schedule-runs"] tr.run-row')
    expect(runs).to_have_count(2)
    expect(runs.nth(0).locator('[data-k="run"]')).to_have_text(fired[1])
    expect(runs.nth(0).locator('[data-k="scheduled-at"]')).to_have_text("2026-12-02T06:00:00Z")
    expect(page.locator('[data-k="firings"] li')).to_have_count(2)
    page.screenshot(path=str(artefacts / "schedule.png"), full_page=True)
    runs.nth(1).locator('[data-k="run"] a').click()
    expect(page.locator(f'.run[data-run="{fired[0]}"]')).to_be_visible()
    link = page.locator('[data-k="schedule-link"]')
    expect(link).to_have_text(weekday["id"])
    link.click()
    expect(page.locator(f'.schedule[data-schedule="{weekday["id"]}"]')).to_be_visible()
    assert page.errors == []
    assert all(status < 400 for status, _ in page.responses), [r for r in page.responses if r[0] >= 400]
