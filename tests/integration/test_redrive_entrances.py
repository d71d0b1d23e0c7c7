"""Redrive's entrances: `laneflow redrive RUN` (exit codes, the lines it prints, `--json`
machine-clean) and `POST /runs/{run_id}/redrive` through the API's resolver (200 with the
record as GET answers it and one drive started, 409 naming why, 404 for a missing run and
for another tenant's, 400 for a body it does not take, 503 where no drive can start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_calls import RecordingDrives, call
from helpers import started_drives, write_workspace
from integration.test_redrive import AGENTS, FLOWS

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.records import RunStatus
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run
from laneflow.wiring import local_engine


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return write_workspace(tmp_path / "ws", AGENTS, FLOWS)


# -- laneflow redrive ----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def laneflow(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--step-workers", "0"] if argv[0] in ("run", "redrive") else list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_redrive_drives_a_failed_run_to_its_end_here_and_prints_what_run_prints(
    ws: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = laneflow(capsys, "run", str(ws), "desk", "--store", store, "--json")
    run_id = json.loads(out)["id"]
    assert code == 1

    code, out, err = laneflow(capsys, "redrive", run_id, "--store", store)

    assert code == 0
    assert f"laneflow: redriving run {run_id} (redrive 1): 2 step(s) run again; completed steps are kept" in err
    assert out.startswith(f"{run_id}: completed (3 completed); cost $0.0300")
    assert f"see it: laneflow show {run_id}" in out


def test_redrive_json_prints_the_record_alone(ws: Path, store: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = laneflow(capsys, "run", str(ws), "desk", "--store", store, "--json")
    run_id = json.loads(out)["id"]

    code, out, err = laneflow(capsys, "redrive", run_id, "--store", store, "--json", "--quiet")

    record = json.loads(out)  # the whole of stdout is one JSON document
    assert code == 0 and record["id"] == run_id and record["status"] == "completed"
    assert record["redrives"] == 1 and record["drives"] == 2
    assert [s["attempts"] for s in record["steps"]] == [1, 2, 1]
    assert err == ""


def test_a_redriven_run_that_fails_again_exits_1_with_the_reason(
    ws: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = laneflow(capsys, "run", str(ws), "rescued", "--store", store, "--json")
    run_id = json.loads(out)["id"]

    code, out, err = laneflow(capsys, "redrive", run_id, "--store", store)

    assert code == 1
    assert f"laneflow: run {run_id} failed: step 0 (failer) failed: cannot write today" in err
    assert out.startswith(f"{run_id}: failed") and f"see it: laneflow show {run_id}" in out


def test_redrive_refuses_a_completed_run_and_an_unknown_one_with_exit_2_and_nothing_on_stdout(
    ws: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = laneflow(capsys, "run", str(ws), "quick", "--store", store, "--json")
    run_id = json.loads(out)["id"]

    code, out, err = laneflow(capsys, "redrive", run_id, "--store", store, "--json")
    assert (code, out) == (2, "")
    assert err == f"laneflow: run {run_id} completed: there is nothing to redrive\n"

    code, out, err = laneflow(capsys, "redrive", "run-nope", "--store", store)
    assert (code, out, err) == (2, "", "laneflow: no run 'run-nope'\n")


# -- POST /runs/{run_id}/redrive -------------------------------------------------------------------


@pytest.fixture
def api_svc(svc: Services, ws: Path) -> Services:
    svc.workspaces = FolderWorkspaces(ws.parent)
    svc.drives = RecordingDrives()
    return svc


def test_the_route_answers_200_with_the_record_as_get_does_and_starts_one_drive(api_svc: Services, ws: Path) -> None:
    run = create_run(api_svc, ws, "desk", tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)

    status, record, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive")

    assert status == 200
    assert started_drives(api_svc) == [("acme", run.id)]
    _, got, _ = call(api_svc, "GET", f"/runs/{run.id}")
    assert record == got  # the recording starter drove nothing: the record is as stored
    assert record["status"] == "queued" and record["redrives"] == 1 and record["error"] is None
    assert [s["status"] for s in record["steps"]] == ["completed", "pending", "pending"]


def test_a_redrive_the_drive_starter_runs_answers_the_record_it_left_and_a_second_one_is_a_409(
    api_svc: Services, ws: Path
) -> None:
    run = create_run(api_svc, ws, "desk", tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)
    api_svc.drives = RecordingDrives(local_engine(api_svc))  # drives the run there and then

    status, record, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive")  # no body
    assert status == 200 and record["status"] == "completed" and record["redrives"] == 1
    assert [s["status"] for s in record["steps"]] == ["completed"] * 3

    status, payload, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive", {})  # an empty object
    assert status == 409 and payload["message"] == f"run {run.id} completed: there is nothing to redrive"
    assert started_drives(api_svc) == [("acme", run.id)]


@pytest.mark.parametrize(
    ("flow", "why"),
    [("quick", "completed: there is nothing to redrive"), ("approval", "is waiting for a person")],
)
def test_the_route_answers_409_naming_why_and_starts_nothing(api_svc: Services, ws: Path, flow: str, why: str) -> None:
    run = create_run(api_svc, ws, flow, tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)
    before = api_svc.store.get_run("acme", run.id).model_dump()

    status, payload, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive")

    assert status == 409 and why in payload["message"] and payload["problems"] == []
    assert started_drives(api_svc) == [] and api_svc.store.get_run("acme", run.id).model_dump() == before


def test_a_missing_run_and_another_tenants_run_are_404s(api_svc: Services, ws: Path) -> None:
    run = create_run(api_svc, ws, "desk", tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)

    status, payload, _ = call(api_svc, "POST", "/runs/run-nope/redrive")
    assert status == 404 and payload["message"] == "no run 'run-nope'"
    status, payload, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive", tenant="globex")
    assert status == 404 and payload["message"] == f"no run {run.id!r}"
    assert started_drives(api_svc) == [] and api_svc.store.get_run("acme", run.id).status == RunStatus.failed


@pytest.mark.parametrize("body", ['{"reason": "again"}', "[1]", '"x"', "{not json"])
def test_a_body_the_route_does_not_take_is_a_400_and_nothing_is_redriven(api_svc: Services, ws: Path, body: str) -> None:
    run = create_run(api_svc, ws, "desk", tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)

    status, payload, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive", raw_body=body)

    assert status == 400 and payload["problems"] and payload["problems"][0]["in"] == "body"
    assert started_drives(api_svc) == [] and api_svc.store.get_run("acme", run.id).redrives == 0


def test_where_no_drive_can_start_the_route_is_a_503_and_nothing_is_redriven(api_svc: Services, ws: Path) -> None:
    run = create_run(api_svc, ws, "desk", tenant="acme")
    local_engine(api_svc).drive("acme", run.id, tick_s=0.02)
    api_svc.drives = None

    status, payload, _ = call(api_svc, "POST", f"/runs/{run.id}/redrive")

    assert status == 503 and payload["message"] == "this deployment cannot start drives"
    assert api_svc.store.get_run("acme", run.id).status == RunStatus.failed
