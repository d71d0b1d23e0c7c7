"""The API's questions: `GET /questions` lists what steps wait on, `POST
/runs/{id}/steps/{index}/answer` answers one (400, 404 and 409 naming the problem), and a
step asking through the real definition on the embedded engine gets the API's answer."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from api_calls import RecordingDrives, call
from helpers import write_workspace

from laneflow.domain.records import EventType, Run, RunStatus
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run
from laneflow.wiring import local_engine

TENANT = "acme"


@pytest.fixture
def api_svc(svc: Services) -> Services:
    svc.drives = RecordingDrives()
    return svc


def asker_run(svc: Services, tmp_path: Path, *, ask_timeout: float = 60) -> tuple[Run, threading.Thread, list[Any]]:
    agents = {
        "asker": {"tools": ["ask"], "ask_timeout": ask_timeout, "stub": 'tool: ask {"question": "North or south?"}\nAsked.'}
    }
    ws = write_workspace(tmp_path / "ws", agents, {"desk": {"description": "one asker", "steps": [{"agent": "asker"}]}})
    run = create_run(svc, ws, "desk", tenant=TENANT)
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(local_engine(svc).drive(TENANT, run.id, tick_s=0.02).run), daemon=True)
    thread.start()
    return run, thread, done


def test_a_step_waiting_on_a_question_is_listed_and_the_apis_answer_reaches_it(api_svc: Services, tmp_path: Path) -> None:
    run, thread, done = asker_run(api_svc, tmp_path)
    deadline = time.monotonic() + 30
    listed: list[Any] = []
    while time.monotonic() < deadline and not listed:
        status, body, _ = call(api_svc, "GET", "/questions", tenant=TENANT)
        assert status == 200
        listed = body["questions"]
        time.sleep(0.05)
    assert listed == [
        {
            "run_id": run.id,
            "index": 0,
            "agent": "asker",
            "question": "North or south?",
            "asked_at": listed[0]["asked_at"],
            "answer_at": f"/runs/{run.id}/steps/0/answer",
        }
    ]
    assert call(api_svc, "GET", "/questions", tenant="globex")[1] == {"questions": []}  # another tenant sees none
    assert call(api_svc, "GET", "/questions", query={"run": "run-other"}, tenant=TENANT)[1] == {"questions": []}
    status, body, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/0/answer", {"text": "North."}, tenant=TENANT)
    assert status == 200 and body["answer"] == "North." and body["question"] == "North or south?"
    thread.join(60)
    [ended] = done
    assert ended.status == RunStatus.completed, ended.error
    assert "a person answered: North." in [e.text for e in ended.steps[0].events if e.type == EventType.ask]
    status, body, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/0/answer", {"text": "South."}, tenant=TENANT)
    assert status == 409 and "waiting on no question" in body["message"] and "answered" in body["message"]


def test_a_bad_answer_is_a_400_and_a_missing_run_or_step_a_404_naming_it(api_svc: Services, tmp_path: Path) -> None:
    run, thread, done = asker_run(api_svc, tmp_path, ask_timeout=1)
    for body in ({}, {"text": ""}, {"text": 42}, {"text": "ok", "extra": 1}, {"text": "x" * 20_001}):
        status, said, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/0/answer", body, tenant=TENANT)
        assert status == 400, (body, said)
        assert "text" in str(said) or "extra" in str(said)
    status, said, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/-1/answer", {"text": "ok"}, tenant=TENANT)
    assert status == 400
    status, said, _ = call(api_svc, "POST", "/runs/run-none/steps/0/answer", {"text": "ok"}, tenant=TENANT)
    assert status == 404 and "run-none" in said["message"]
    status, said, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/7/answer", {"text": "ok"}, tenant=TENANT)
    assert status == 404 and "no step 7" in said["message"]
    status, said, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/0/answer", {"text": "ok"}, tenant="globex")
    assert status == 404  # another tenant's run is answered like a missing one
    thread.join(60)
    status, said, _ = call(api_svc, "POST", f"/runs/{run.id}/steps/0/answer", {"text": "late"}, tenant=TENANT)
    assert status == 409 and "expired" in said["message"]
