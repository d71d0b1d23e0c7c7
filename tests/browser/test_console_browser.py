"""The run viewer as an operator's console, in headless Chromium against a real `laneflow
serve`: Stop and Reject ask first in the page's own dialog (modal, Escape closes it, Tab stays
in it) and send the reason the record keeps; a stopped run shows as stopped; Redrive on a
failed run shows what the API answered; the list pages and searches with its state in the URL
(a reload restores it); a run's raw event history and its captures are one click away; each
page has one h1, says status changes politely, and has a favicon that is served. Screenshots
of each page are left in build/browser/ (`artefacts`)."""

from __future__ import annotations

import json
import re
import struct
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from playwright.sync_api import expect

from laneflow.domain.records import Run, RunStatus, Step, StepStatus
from laneflow_dev import browser as harness

pytestmark = pytest.mark.slow


def open_run(page: Any, served: harness.Served, run_id: str) -> None:
    page.goto(f"{served.url}/#/runs/{run_id}")
    expect(page.locator(f'.run[data-run="{run_id}"]')).to_be_visible()


def focused(page: Any) -> dict[str, Any]:
    """What has the keyboard's focus: its tag, id, text, and the run of its row."""
    found: dict[str, Any] = page.evaluate(
        """() => { const e = document.activeElement;
          return { tag: e.tagName, id: e.id, text: e.textContent.trim(), run: e.closest('tr') && e.closest('tr').dataset.run }; }"""
    )
    return found


def tab_to(page: Any, wanted: Any, most: int = 80) -> None:
    """Press Tab until `wanted(focused)` holds (the keyboard alone reaches it), or fail."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if wanted(focused(page)):
            return
    raise AssertionError(f"Tab never reached it; the focus ended on {focused(page)}")


def hash_query(page: Any) -> dict[str, list[str]]:
    fragment = urlsplit(page.url).fragment
    return parse_qs(fragment.partition("?")[2])


def redrive_route_exists(served: harness.Served) -> bool:
    with urllib.request.urlopen(served.url + "/openapi.json", timeout=10) as answer:
        return "/runs/{run_id}/redrive" in json.loads(answer.read())["paths"]


def test_stop_from_the_list_by_keyboard_alone_asks_in_a_dialog_takes_a_reason_and_the_run_shows_stopped(
    page: Any, served: harness.Served
) -> None:
    # Given a running run (its lead takes 20 s) in the list,
    run_id = served.start("ws_gate", "stop")
    served.wait(run_id, "running")
    page.goto(served.url + "/")
    row = page.locator(f'tr.run-row[data-run="{run_id}"]')
    expect(row.locator('[data-k="status"]')).to_have_text("running")

    # When a person reaches its Stop with Tab and presses Enter,
    tab_to(page, lambda f: f["run"] == run_id and f["text"].startswith("Stop"))
    page.keyboard.press("Enter")

    # Then a dialog asks first, the focus in its reason field, the page behind it inert,
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_have_attribute("aria-modal", "true")
    expect(dialog.get_by_role("heading")).to_have_text(f"Stop run {run_id}?")
    expect(page.locator("#dialog-reason")).to_be_focused()
    expect(page.locator("main")).to_have_attribute("inert", "")
    # and Tab goes round inside it: the reason, Cancel, the stop, and back to the reason.
    page.keyboard.type("wrong input file")
    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Cancel"
    page.keyboard.press("Tab")
    assert focused(page)["text"] == "Stop the run"
    page.keyboard.press("Tab")
    assert focused(page)["id"] == "dialog-reason"
    page.keyboard.press("Shift+Tab")
    assert focused(page)["text"] == "Stop the run"
    assert served.run(run_id).stop_requested is False  # nothing was sent before the person confirmed

    # When they confirm with Enter,
    page.keyboard.press("Enter")

    # Then the run is stopped with their reason, and the list shows it stopped (not failed),
    run = served.wait(run_id, "failed", timeout_s=30)
    assert run.stop_requested and run.error == "stopped by a person: wrong input file"
    expect(dialog).to_have_count(0)
    expect(page.locator("main")).not_to_have_attribute("inert", "")
    expect(row.locator('[data-k="status"]')).to_have_text("stopped", timeout=15000)
    expect(row).to_contain_text("stopped by a person: wrong input file")
    # with nothing left to stop, and no redrive (a stopped run is not redriven).
    expect(row.get_by_role("button")).to_have_count(0)
    assert not page.errors


def test_escape_closes_the_reject_dialog_sending_nothing_and_a_reject_with_a_reason_fails_the_run(
    page: Any, served: harness.Served
) -> None:
    run_id = served.start("ws_control", "approval")
    served.wait(run_id, "awaiting-approval")
    open_run(page, served, run_id)
    reject = page.get_by_role("button", name="Reject", exact=True)

    # A person opens the dialog, then leaves it with Escape: nothing is sent, the focus is back.
    reject.click()
    expect(page.get_by_role("dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(reject).to_be_focused()
    page.wait_for_timeout(300)
    assert served.run(run_id).status == RunStatus.awaiting_approval
    # A click outside the dialog leaves it too.
    reject.click()
    page.mouse.click(5, 880)
    expect(page.get_by_role("dialog")).to_have_count(0)
    assert served.run(run_id).status == RunStatus.awaiting_approval

    # Then rejecting with a reason fails the run with it, and the page says so.
    page.keyboard.press("Enter")  # the focus is back on Reject
    page.locator("#dialog-reason").fill("the figures are wrong")
    page.get_by_role("dialog").get_by_role("button", name="Reject the run").click()
    run = served.wait(run_id, "failed", timeout_s=15)
    assert run.error == "rejected by a person: the figures are wrong" and not run.stop_requested
    expect(page.locator(".run")).to_have_attribute("data-shown", "failed", timeout=15000)
    expect(page.locator('[data-k="run-error"]')).to_have_text("rejected by a person: the figures are wrong")
    expect(page.locator(".head .pill").first).to_have_text("failed")
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    assert not page.errors


def test_redrive_is_offered_on_a_failed_run_only_and_shows_what_the_api_answered(page: Any, served: harness.Served) -> None:
    # Given a run that failed (rejected), one stopped and one completed,
    failed = served.start("ws_control", "approval")
    stopped = served.start("ws_control", "approval")
    done = served.start("ws_gate", "lone")
    for run_id in (failed, stopped):
        served.wait(run_id, "awaiting-approval")
    served.post(f"/runs/{failed}/approval", {"approve": False})
    served.post(f"/runs/{stopped}/stop")
    served.wait(done, "completed")
    page.goto(served.url + "/")
    rows = {run_id: page.locator(f'tr.run-row[data-run="{run_id}"]') for run_id in (failed, stopped, done)}
    expect(rows[stopped].locator('[data-k="status"]')).to_have_text("stopped")

    # Then only the failed one has Redrive,
    expect(rows[failed].get_by_role("button", name="Redrive")).to_have_count(1)
    expect(rows[stopped].get_by_role("button", name="Redrive")).to_have_count(0)
    expect(rows[done].get_by_role("button", name="Redrive")).to_have_count(0)

    said = rows[failed].locator('[data-k="said"]')
    if not redrive_route_exists(served):
        # and, where this server has no redrive route, pressing it shows the 404 it answered.
        rows[failed].get_by_role("button", name="Redrive").click()
        expect(said).to_contain_text("redrive refused (HTTP 404): no route")
        expect(said).to_have_class(re.compile(r"\berr\b"))

    # A refusal (409) shows the API's reason, said in its `error`.
    def refuse(route: Any) -> None:
        route.fulfill(status=409, json={"error": f"run {failed} was rejected by a person: a rejection is not redriven"})

    page.route(f"**/runs/{failed}/redrive", refuse)
    rows[failed].get_by_role("button", name="Redrive").click()
    expect(said).to_have_text(f"redrive refused (HTTP 409): run {failed} was rejected by a person: a rejection is not redriven")
    assert not page.errors


def _stored_runs(served: harness.Served, n: int) -> list[str]:
    """n ended runs written to the store, a minute apart (the last newest): every third
    failed, every sixth for a spent quota."""
    made = []
    for i in range(n):
        failed = i % 3 == 0
        run = Run(
            id=f"run-page-{i:02d}",
            tenant=served.tenant,
            workspace="ws_gate",
            flow="lone",
            status=RunStatus.failed if failed else RunStatus.completed,
            created_at=f"2026-01-01T00:{i:02d}:00.000Z",
            finished_at=f"2026-01-01T00:{i:02d}:30.000Z",
            error=("the model's quota was spent" if i % 6 == 0 else "a step failed") if failed else None,
            steps=[Step(index=0, group=0, agent="quick", status=StepStatus.failed if failed else StepStatus.completed)],
        )
        served.svc.store.create_run(run)
        made.append(run.id)
    return made[::-1]  # newest first, as listed


def test_the_list_pages_and_searches_with_its_state_in_the_url_and_a_reload_or_back_restores_it(
    page: Any, served: harness.Served
) -> None:
    newest_first = _stored_runs(served, 30)
    rows = page.locator("tr.run-row")
    page.goto(served.url + "/")
    expect(rows).to_have_count(25)
    expect(rows.first).to_have_attribute("data-run", newest_first[0])
    expect(page.locator('[data-k="page"]')).to_have_text("page 1")

    # Older: the next page, its cursor in the URL; a reload stays on it.
    page.get_by_role("button", name="Older").click()
    expect(rows).to_have_count(5)
    expect(page.locator('[data-k="page"]')).to_have_text("page 2")
    assert hash_query(page) == {"before": [newest_first[24]]}
    assert [rows.nth(i).get_attribute("data-run") for i in range(5)] == newest_first[25:]
    page.reload()
    expect(rows).to_have_count(5)
    expect(rows.first).to_have_attribute("data-run", newest_first[25])
    expect(page.get_by_role("button", name="Older")).to_be_disabled()  # nothing older

    # Newer goes back a page; a filter starts again from the newest.
    page.get_by_role("button", name="Newer").click()
    expect(rows).to_have_count(25)
    page.get_by_role("button", name="failed", exact=True).click()
    expect(rows).to_have_count(10)
    assert hash_query(page) == {"status": ["failed"]}
    expect(page.get_by_role("button", name="failed", exact=True)).to_have_attribute("aria-pressed", "true")

    # A search narrows it, as it is typed, and the URL follows.
    page.get_by_label("Search").fill("quota")
    expect(rows).to_have_count(5)
    expect(page).to_have_url(re.compile(r"q=quota"))
    assert hash_query(page) == {"status": ["failed"], "q": ["quota"]}
    assert all("quota" in rows.nth(i).inner_text() for i in range(5))
    # (what is typed stays as typed when the URL, which keeps the search trimmed, follows it)
    page.get_by_label("Search").fill("")
    page.keyboard.type("  spent")
    expect(page).to_have_url(re.compile(r"q=spent"))
    page.wait_for_timeout(200)
    expect(page.get_by_label("Search")).to_have_value("  spent")
    expect(rows).to_have_count(5)
    page.get_by_label("Search").fill("quota")
    expect(page).to_have_url(re.compile(r"q=quota"))

    # A reload restores the filter, the search box and the rows.
    page.reload()
    expect(rows).to_have_count(5)
    expect(page.get_by_label("Search")).to_have_value("quota")
    expect(page.get_by_role("button", name="failed", exact=True)).to_have_attribute("aria-pressed", "true")

    # Back undoes the filter (typing replaced its entry): the newest page of every run.
    page.go_back()
    expect(rows).to_have_count(25)
    expect(page.get_by_label("Search")).to_have_value("")
    assert hash_query(page) == {}

    # A search by a run's id finds it alone; one that matches nothing says so.
    page.get_by_label("Search").fill("page-07")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run", "run-page-07")
    page.get_by_label("Search").fill("nothing has this")
    expect(page.locator('[data-k="none"]')).to_contain_text("No run here matches")
    assert unquote(urlsplit(page.url).fragment) == "/?q=nothing+has+this"
    assert not page.errors


def test_a_runs_event_history_is_one_click_away_newest_last_filtered_by_step_and_its_captures_linked(
    page: Any, served: harness.Served
) -> None:
    # Given a gated fan-out (gate events on its steps) and a tool-use run (its calls captured),
    fanout = served.start("ws_claude", "fanout")
    tools = served.start("ws_claude", "tools")
    fan_run = served.wait(fanout, "completed")
    tool_run = served.wait(tools, "completed")
    every = [(s.index, e.text) for s in fan_run.steps for e in s.events]
    assert len({i for i, _ in every}) > 1  # events on more than one step

    # When a person opens the run and clicks its history,
    open_run(page, served, fanout)
    page.locator('[data-k="history-link"]').click()

    # Then every event of every step is listed, oldest first and newest last,
    table = page.locator('[data-k="history"] tbody tr')
    expect(page.get_by_role("heading", level=1)).to_have_text("Event history")
    expect(table).to_have_count(len(every))
    times = [t.get_attribute("datetime") for t in page.locator('[data-k="history"] time').all()]
    assert times == sorted(times) and set(times) == {e.t for s in fan_run.steps for e in s.events}
    # and a step chosen shows its own alone, the choice kept in the URL.
    sibling = fan_run.steps[1]
    page.get_by_label("Step").select_option(str(sibling.index))
    expect(table).to_have_count(len(sibling.events))
    assert {table.nth(i).get_attribute("data-step") for i in range(len(sibling.events))} == {str(sibling.index)}
    assert hash_query(page) == {"step": [str(sibling.index)]}
    page.reload()
    expect(table).to_have_count(len(sibling.events))

    # A step's captures: listed in its detail by reference, linked to its history.
    references = [e.data["capture"] for e in tool_run.steps[0].events if e.data and "capture" in e.data]
    assert len(references) == 2
    open_run(page, served, tools)
    page.locator('.step[data-step="0"] > button.row').click()
    captures = page.locator('[data-detail="0"] [data-k="captures"]')
    for reference in references:
        expect(captures).to_contain_text(reference)
    captures.locator('[data-k="captures-link"]').click()
    expect(table).to_have_count(2)
    assert hash_query(page) == {"step": ["0"], "captures": ["1"]}
    for n, reference in enumerate(references):
        expect(table.nth(n).locator('[data-k="capture"]')).to_have_text(f"capture {reference}")
    # an event's data, as recorded, a click away
    table.nth(0).get_by_role("button", name=re.compile("^data")).click()
    expect(table.nth(0).locator("pre")).to_contain_text('"input_chars"')
    assert not page.errors


def test_each_page_has_one_h1_says_a_status_change_politely_and_its_favicon_is_served(page: Any, served: harness.Served) -> None:
    run_id = served.start("ws_gate", "stop")
    served.wait(run_id, "running")
    page.goto(served.url + "/")
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("h1")).to_have_count(1)
    expect(page.locator("h1")).to_have_text("Runs")

    # The favicon the page names is served (no 404 anywhere), as an SVG of this origin.
    href = page.locator('link[rel="icon"]').get_attribute("href")
    assert href == "/assets/favicon.svg"
    icon = page.request.get(served.url + href)
    assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml" and icon.text().startswith("<svg")

    # The run's page: its id is the h1, and when it is stopped elsewhere the page says so.
    open_run(page, served, run_id)
    expect(page.locator("h1")).to_have_count(1)
    expect(page.locator("h1")).to_have_text(run_id)
    announcer = page.locator('[data-k="announce"]')
    expect(announcer).to_have_attribute("aria-live", "polite")
    expect(announcer).to_have_attribute("role", "status")
    served.post(f"/runs/{run_id}/stop", {"reason": "from a script"})
    expect(announcer).to_have_text(f"run {run_id} is now stopped", timeout=15000)
    expect(page.locator(".run")).to_have_attribute("data-shown", "stopped")
    expect(page.locator('[data-k="run-error"]')).to_have_text("stopped by a person: from a script")
    page.locator('[data-k="history-link"]').click()
    expect(page.locator("h1")).to_have_count(1)
    assert not [answer for answer in page.responses if answer[0] >= 400], page.responses
    assert not page.errors


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_screenshots_of_the_list_a_run_its_history_and_a_dialog_are_saved_and_nothing_overflows_a_phone(
    chromium: Any, served: harness.Served, artefacts: Path
) -> None:
    # Given runs of every kind: completed with tool calls, parked, rejected with a reason, stopped,
    tools = served.start("ws_claude", "tools")
    parked = served.start("ws_control", "approval")
    rejected = served.start("ws_control", "approval")
    stopped = served.start("ws_gate", "stop")
    served.wait(rejected, "awaiting-approval")
    served.post(f"/runs/{rejected}/approval", {"approve": False, "reason": "the numbers look off"})
    served.wait(stopped, "running")
    served.post(f"/runs/{stopped}/stop", {"reason": "wrong input"})
    served.wait(tools, "completed")
    served.wait(parked, "awaiting-approval")
    served.wait(stopped, "failed", timeout_s=30)

    saved = []
    for width, height, name in ((1280, 800, "desktop"), (390, 844, "phone")):
        context = chromium.new_context(viewport={"width": width, "height": height}, is_mobile=width < 500)
        shot = context.new_page()
        try:
            shot.goto(served.url + "/")
            expect(shot.locator("tr.run-row")).to_have_count(4)
            saved.append(_shoot(shot, artefacts / f"console-list-{name}.png", width))
            shot.goto(f"{served.url}/#/runs/{tools}")
            shot.locator('.step[data-step="0"] > button.row').click()
            expect(shot.locator('[data-detail="0"] [data-k="captures"]')).to_be_visible()
            saved.append(_shoot(shot, artefacts / f"console-run-{name}.png", width))
            shot.goto(f"{served.url}/#/runs/{tools}/history")
            expect(shot.locator('[data-k="history"]')).to_be_visible()
            saved.append(_shoot(shot, artefacts / f"console-history-{name}.png", width))
            shot.goto(f"{served.url}/#/runs/{parked}")
            shot.get_by_role("button", name="Reject", exact=True).click()
            shot.locator("#dialog-reason").fill("not this week")
            saved.append(_shoot(shot, artefacts / f"console-dialog-{name}.png", width, full=False))
        finally:
            context.close()
    assert len(saved) == 8 and all(_png_size(path)[0] == width for path, width in saved)


def _shoot(page: Any, path: Path, width: int, *, full: bool = True) -> tuple[Path, int]:
    page.wait_for_timeout(300)  # the clock's tick and the poll settle
    assert page.evaluate("document.documentElement.scrollWidth") <= width, path.name
    page.screenshot(path=str(path), full_page=full)
    return path, width
