"""The run viewer, used the way a person uses it, in headless Chromium against a real
`laneflow serve`: the list, a gated fan-out's lane with its waits and cache figures, live
updates that keep open details open, Stop, Approve and Reject (checked in the store), a
phone's width, and no request anywhere but the server. The console's own (dialogs, reasons,
paging and search in the URL, the event history, keyboard use): test_console_browser.py."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from laneflow_dev import browser as harness

pytestmark = pytest.mark.slow

LANE = "analyst@claude-sonnet-4-6"


def run_page(page: Any, served: Any, run_id: str) -> None:
    page.goto(f"{served.url}/#/runs/{run_id}")
    expect(page.locator(f'.run[data-run="{run_id}"]')).to_be_visible()


def test_the_list_shows_each_run_with_its_status_flow_and_cost(page: Any, served: harness.Served) -> None:
    # Given two runs that have ended, one on Claude (through the imitation), one on the stub,
    gated = served.start("ws_claude", "fanout")
    stub = served.start("ws_gate", "fanout")
    served.wait(gated, "completed")
    served.wait(stub, "completed")

    # When a person opens the viewer,
    page.goto(served.url + "/")

    # Then both runs are listed, newest first, with their status, flow and cost.
    rows = page.locator("tr.run-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text(stub)
    expect(rows.nth(0)).to_contain_text("ws_gate / fanout")
    expect(rows.nth(1)).to_contain_text("ws_claude / fanout")
    expect(rows.nth(1).locator('[data-k="status"]')).to_have_text("completed")
    cost = served.run(gated).cost_usd
    assert cost > 0
    expect(rows.nth(1).locator('[data-k="cost"]')).to_have_text(re.compile(r"^\$0\.\d+$"))
    # A run started now appears without a reload.
    third = served.start("ws_gate", "lone")
    expect(page.locator(f'tr.run-row[data-run="{third}"]')).to_be_visible()
    # A filter shows only the runs of one status.
    parked = served.start("ws_control", "approval")
    served.wait(parked, "awaiting-approval")
    page.get_by_role("button", name="awaiting-approval").click()
    expect(rows).to_have_count(1)
    expect(rows.nth(0)).to_contain_text(parked)
    page.get_by_role("button", name="all").click()
    expect(rows).to_have_count(4)
    assert not page.errors


def test_a_gated_fan_out_shows_its_lane_with_one_cold_prefix_its_gate_waits_and_cache_figures(
    page: Any, served: harness.Served
) -> None:
    run_id = served.start("ws_claude", "fanout")
    run = served.wait(run_id, "completed")
    lead, *siblings = run.steps
    written = lead.calls[0].tokens.cache_write
    read = sum(c.tokens.cache_read for s in run.steps for c in s.calls)
    assert written > 0 and read >= 3 * written

    run_page(page, served, run_id)

    # The lane: its steps, one cold prefix, the cache figures of its calls.
    lane = page.locator(f'.group[data-group="0"] .lane[data-lane="{LANE}"]')
    expect(lane.locator(".step")).to_have_count(4)
    expect(lane.locator('.chip[data-k="cold"]')).to_have_text("1 cold prefix")
    row = page.locator(f'table.lanes tr[data-lane="{LANE}"]')
    expect(row.locator('[data-k="cold"]')).to_have_text("1")
    assert int(row.locator('[data-k="write"]').inner_text().rstrip("k").split(".")[0]) > 0
    # What the gate saved: three siblings read the prefix instead of writing it again, in dollars too.
    expect(page.locator('[data-k="gate-saved"]')).to_contain_text("saved 3 cold prefixes")
    (lane_row,) = run.public()["lanes"]
    assert lane_row["gate_savings_usd"] > 0
    expect(row.locator('[data-k="gate-savings"]')).to_have_text(re.compile(r"^\$0\.\d{3,4}$"))
    expect(page.locator('[data-k="gate-saved"]')).to_contain_text(re.compile(r"worth \$0\.\d+"))
    expect(page.locator('[data-k="run-savings"]')).to_contain_text("cache saved")
    # Each sibling's wait for its lead is shaded; each step's first token is marked.
    expect(lane.locator('.step[data-step="0"] [data-k="gate-wait"]')).to_have_count(0)
    for sibling in siblings:
        expect(lane.locator(f'.step[data-step="{sibling.index}"] [data-k="gate-wait"]')).to_have_count(1)
    expect(lane.locator('[data-k="first-token"]')).to_have_count(4)
    # Where the time went: the group, with its gate waits and model time.
    expect(page.locator('[data-k="time"]')).to_contain_text("gate waits")

    # A sibling opened: its cache figures, its spans, its layers against the lead's.
    lane.locator('.step[data-step="1"] > button.row').click()
    detail = page.locator('[data-detail="1"]')
    expect(detail).to_contain_text(f"{siblings[0].calls[0].tokens.cache_read} / 0")  # cache read / write
    expect(detail.locator("table.calls tbody tr")).to_have_count(len(siblings[0].calls))
    expect(detail.locator('[data-k="layers"]')).to_contain_text("#0")
    expect(detail).to_contain_text("waiting for the first analyst step")
    assert not page.errors


def test_live_updates_keep_an_opened_step_open_while_the_run_changes(page: Any, served: harness.Served) -> None:
    # Given a run whose siblings wait for a lead that takes 20 s,
    run_id = served.start("ws_gate", "stop")
    served.wait(run_id, "running")
    run_page(page, served, run_id)
    expect(page.locator(".run")).to_have_attribute("data-status", "running")
    # When a person opens a waiting sibling, and the run is then stopped elsewhere (the API),
    page.locator('.step[data-step="1"] > button.row').click()
    detail = page.locator('[data-detail="1"]')
    expect(detail).to_contain_text("waiting for the first long step")
    served.post(f"/runs/{run_id}/stop")
    # Then the page follows the change (streamed) and the opened step stays open, updated.
    expect(page.locator(".run")).to_have_attribute("data-status", "failed", timeout=15000)
    expect(detail).to_be_visible()
    expect(detail).to_contain_text("skipped")
    expect(page.locator('[data-k="live"]')).to_have_text(re.compile("live|ended"))
    assert any(url.endswith(f"/runs/{run_id}/stream") for url in page.requests)


def test_stop_on_a_running_run_ends_it_and_skips_the_siblings_waiting_for_their_lead(page: Any, served: harness.Served) -> None:
    # Given a fan-out whose lead takes 20 s to reply (its siblings wait for it),
    run_id = served.start("ws_gate", "stop")
    served.wait(run_id, "running")
    run_page(page, served, run_id)
    expect(page.locator('.step[data-phase="waiting"]').first).to_be_visible()
    # When the person presses Stop (and confirms in the page's dialog),
    page.get_by_role("button", name="Stop").click()
    page.get_by_role("dialog").get_by_role("button", name="Stop the run").click()
    # Then the run ends failed, stopped, with nothing left pending, and the page says so.
    run = served.wait(run_id, "failed", timeout_s=30)
    assert run.stop_requested and run.finished_at
    assert all(s.status != "pending" for s in run.steps)
    waited = [s for s in run.steps if s.index in (1, 2)]
    assert all(s.status == "skipped" and "stopped" in (s.skip_reason or "") for s in waited)
    expect(page.locator(".run")).to_have_attribute("data-status", "failed", timeout=15000)
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)


def test_approve_on_a_parked_run_continues_it_to_completion(page: Any, served: harness.Served) -> None:
    run_id = served.start("ws_control", "approval")
    served.wait(run_id, "awaiting-approval")
    run_page(page, served, run_id)
    expect(page.locator(".group .lane[data-lane=approval]")).to_be_visible()

    page.get_by_role("button", name="Approve").click()

    run = served.wait(run_id, "completed", timeout_s=30)
    assert run.drives == 2 and all(s.status == "completed" for s in run.steps)
    expect(page.locator(".run")).to_have_attribute("data-status", "completed", timeout=15000)


def test_reject_from_the_list_fails_the_parked_run(page: Any, served: harness.Served) -> None:
    run_id = served.start("ws_control", "approval")
    served.wait(run_id, "awaiting-approval")
    page.goto(served.url + "/")
    row = page.locator(f'tr.run-row[data-run="{run_id}"]')
    expect(row.locator('[data-k="status"]')).to_have_text("awaiting-approval")

    row.get_by_role("button", name="Reject").click()
    page.get_by_role("dialog").get_by_role("button", name="Reject the run").click()

    run = served.wait(run_id, "failed", timeout_s=15)
    assert run.finished_at and "reject" in (run.error or "").lower()
    expect(row.locator('[data-k="status"]')).to_have_text("failed")


def test_at_a_phones_width_nothing_overflows_and_every_request_stays_on_the_server(chromium: Any, served: harness.Served) -> None:
    run_id = served.start("ws_claude", "fanout")
    served.wait(run_id, "completed")
    context = chromium.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone = context.new_page()
    requests: list[str] = []
    phone.on("request", lambda request: requests.append(request.url))
    try:
        for where in ("/", f"/#/runs/{run_id}"):
            phone.goto(served.url + where)
            phone.wait_for_selector("tr.run-row, .run")
            phone.wait_for_timeout(300)
            assert phone.evaluate("document.documentElement.scrollWidth") <= 390, where
        phone.locator('.step[data-step="2"] > button.row').click()
        expect(phone.locator('[data-detail="2"]')).to_be_visible()
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()
    assert requests and all(url.startswith(served.url + "/") for url in requests), requests


def test_a_record_with_lanes_rows_and_a_cache_break_shows_them_and_names_the_changed_layer(
    page: Any, served: harness.Served
) -> None:
    # Given a real record, as a newer API answers it: with `lanes` rows and a step's
    # `cache_break` (and that step's `skills` layer changed since the agent's previous step),
    run_id = served.start("ws_claude", "fanout")
    record = served.wait(run_id, "completed").public()
    record["lanes"] = [
        {
            "group": 0,
            "cycle": 0,
            "lane": LANE,
            "steps": 4,
            "cold_prefixes": 2,
            "cache_read": 111,
            "cache_write": 222,
            "gate_wait_ms": 4321,
            "savings_usd": 0.0388,
            "gate_savings_usd": 0.0547,
        }
    ]
    # what the prompt cache saved: the lead only wrote (below zero), its siblings read
    for step, saved in zip(record["steps"], [-0.004, 0.0142, 0.0142, 0.0142], strict=True):
        step["savings_usd"] = saved
    record["savings_usd"] = 0.0386
    changed = record["steps"][2]
    changed["cache_break"] = {"layer": "skills", "since": f"{run_id}/1"}
    changed["prompt_layers"] = [
        *changed["prompt_layers"],
        {"name": "skills", "chars": 40, "sha256": "0123456789ab", "dynamic": False},
    ]
    for step in record["steps"][:2]:
        step["prompt_layers"] = [
            *step["prompt_layers"],
            {"name": "skills", "chars": 38, "sha256": "ba9876543210", "dynamic": False},
        ]
    page.route(f"**/runs/{run_id}/stream", lambda route: route.fulfill(status=404, json={"message": "no stream here"}))
    page.route(f"**/runs/{run_id}", lambda route: route.fulfill(status=200, json=record))

    run_page(page, served, run_id)

    # Then the lane's figures are the record's rows (not sums of the calls),
    row = page.locator(f'table.lanes tr[data-lane="{LANE}"]')
    expect(row.locator('[data-k="cold"]')).to_have_text("2")
    expect(row.locator('[data-k="read"]')).to_have_text("111")
    expect(row.locator('[data-k="wait"]')).to_have_text("4.32 s")
    expect(row.locator('[data-k="savings"]')).to_have_text("$0.039")
    expect(row.locator('[data-k="gate-savings"]')).to_have_text("$0.055")
    expect(page.locator('[data-k="gate-saved"]')).to_contain_text("worth $0.055")
    expect(page.locator('[data-k="run-savings"]')).to_have_text("cache saved $0.039")  # beside the run's cost
    expect(page.locator('[data-k="cache"]')).not_to_contain_text("from the steps' calls")
    # the step carries its cache break, and its layers name the one that changed.
    step = page.locator('.step[data-step="2"]')
    expect(step.locator('[data-k="cache-break"]')).to_have_text("cache break: skills")
    step.locator("> button.row").click()
    detail = page.locator('[data-detail="2"]')
    expect(detail).to_contain_text(f"layer skills changed (since {run_id}/1)")
    expect(detail.locator('[data-k="breaking"]')).to_contain_text("skills")
    expect(detail.locator("tr.ch-changed")).to_contain_text("was ba9876543210")
    expect(detail.locator(".fact", has_text="cache saved").locator("dd")).to_have_text("$0.014")
    page.locator('.step[data-step="0"] > button.row').click()  # the lead: it only wrote, so below zero
    expect(page.locator('[data-detail="0"] .fact', has_text="cache saved").locator("dd")).to_have_text("−$0.0040")
    expect(page.locator('[data-k="live"]')).to_have_text("polling")  # no stream: it polls


def test_a_step_waiting_on_a_question_shows_an_answer_box_whose_answer_reaches_it(page: Any, served: harness.Served) -> None:
    # Given a step that asks a person and waits,
    run_id = served.start("ws_ask", "ask")
    served.wait(run_id, "running")
    deadline = time.monotonic() + 30
    while not served.svc.store.list_open_questions(served.tenant) and time.monotonic() < deadline:
        time.sleep(0.05)
    run_page(page, served, run_id)
    page.locator('.step[data-step="0"] > button.row').click()
    box = page.locator('[data-detail="0"] [data-k="answer"]')
    expect(box).to_contain_text("Which coast first, north or south?")
    # When the person answers in the box,
    box.locator("textarea").fill("The north.")
    box.get_by_role("button", name="Answer").click()
    # Then the step gets the answer and completes.
    run = served.wait(run_id, "completed", timeout_s=30)
    assert "a person answered: The north." in [e.text for e in run.steps[0].events]
    assert not page.errors
