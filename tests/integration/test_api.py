"""The HTTP API's run routes (laneflow/api.py), through API Gateway-shaped events as the Lambda
handler receives them: starting a run (idempotency keys, the 400s, 404s, 503 and 500 it
answers), reading runs, and stopping and approving them. The OpenAPI document, the viewer and
the sample events: test_api_document.py; `laneflow serve` over real HTTP: test_api_over_http.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from api_calls import START, RecordingDrives, api_services, call, problem_fields, start
from helpers import FIXTURES, started_drives

from laneflow.domain.records import RunChanges, RunStatus, StepStatus
from laneflow.entrypoints.api import GENERIC_ERROR, idempotent_run_id
from laneflow.ports import Services
from laneflow.usecases.start_run import prepare_run
from laneflow.wiring import local_engine


@pytest.fixture
def api_svc(svc: Services) -> Services:
    return api_services(svc)


# -- starting ----------------------------------------------------------------------------------


def test_start_answers_201_with_the_queued_run_and_its_location_and_starts_one_drive(api_svc: Services) -> None:
    status, run, headers = call(api_svc, "POST", "/runs", {**START, "input": {"topic": "kelp"}})

    assert status == 201
    assert (
        run["status"] == "queued" and run["tenant"] == "acme" and run["workspace"] == "ws_control" and run["flow"] == "approval"
    )
    assert [s["agent"] for s in run["steps"]] == ["writer", None, "poster"]
    assert headers["location"] == [f"/Prod/runs/{run['id']}"]
    assert started_drives(api_svc) == [("acme", run["id"])]
    assert api_svc.store.get_run("acme", run["id"]).status == RunStatus.queued


def test_a_repeated_start_with_the_same_key_returns_the_same_run_and_starts_no_second_drive(api_svc: Services) -> None:
    body = {**START, "idempotency_key": "nightly-2026-11-30"}
    first = start(api_svc, body)
    assert first["id"] == idempotent_run_id("acme", "nightly-2026-11-30")
    # Given the first drive is still running,
    api_svc.store.update_run("acme", first["id"], RunChanges(status=RunStatus.running))

    # when the same start comes again (a client retrying after a timeout),
    status, again, headers = call(api_svc, "POST", "/runs", body)

    # then it is answered with the same run, and nothing new is started.
    assert status == 200 and again["id"] == first["id"] and again["status"] == "running"
    assert headers["location"] == [f"/Prod/runs/{first['id']}"]
    assert started_drives(api_svc) == [("acme", first["id"])]
    assert len(api_svc.store.list_runs("acme")) == 1


def test_the_same_idempotency_key_with_a_different_request_is_a_409_and_starts_nothing(api_svc: Services) -> None:
    start(api_svc, {**START, "idempotency_key": "k1"})

    status, body, _ = call(api_svc, "POST", "/runs", {**START, "input": {"other": True}, "idempotency_key": "k1"})

    assert status == 409 and "idempotency_key" in body["message"]
    assert len(started_drives(api_svc)) == 1 and len(api_svc.store.list_runs("acme")) == 1


def test_an_idempotency_key_names_a_run_per_tenant_never_another_tenants(api_svc: Services) -> None:
    a = start(api_svc, {**START, "idempotency_key": "same"}, tenant="acme")
    b = start(api_svc, {**START, "idempotency_key": "same"}, tenant="globex")

    assert a["id"] != b["id"] and b["tenant"] == "globex"
    assert started_drives(api_svc) == [("acme", a["id"]), ("globex", b["id"])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"workspace": "ws_control"}, "flow"),  # missing
        ({"workspace": 7, "flow": "approval"}, "workspace"),  # wrong type
        ({**START, "input": ["not", "an", "object"]}, "input"),  # wrong type
        ({**START, "tenant": "globex"}, "tenant"),  # unknown: the tenant is never taken from a body
        ({**START, "idempotency_key": ""}, "idempotency_key"),  # too short
    ],
)
def test_a_start_that_does_not_fit_its_model_is_a_400_naming_the_field_and_writes_nothing(
    api_svc: Services, body: Any, field: str
) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", body)

    assert status == 400
    assert field in problem_fields(payload) and field in payload["message"]
    assert started_drives(api_svc) == [] and api_svc.store.list_runs("acme") == []
    assert "globex" not in json.dumps(payload)  # the offending value is not echoed


def test_a_malformed_body_is_a_400_saying_so(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", raw_body="{workspace: ")

    assert status == 400 and payload["problems"][0]["in"] == "body" and "JSON" in payload["problems"][0]["message"]


def test_an_invalid_flow_is_a_400_listing_every_problem_with_its_file_and_no_local_path(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_broken", "flow": "messy"})

    assert status == 400
    assert len(payload["problems"]) >= 2
    assert all(p["file"] and not p["file"].startswith("/") for p in payload["problems"])
    assert str(FIXTURES) not in json.dumps(payload)
    assert started_drives(api_svc) == [] and api_svc.store.list_runs("acme") == []


def test_an_input_that_does_not_fit_the_flows_schema_is_a_400_naming_it(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_ok", "flow": "brief", "input": {}})

    assert status == 400 and "input" in payload["message"]
    assert any("topics" in json.dumps(p) for p in payload["problems"])


def test_an_unknown_workspace_is_a_404_and_an_unknown_flow_a_400(api_svc: Services) -> None:
    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "nowhere", "flow": "brief"})
    assert status == 404 and payload["message"] == "no workspace 'nowhere'"

    status, payload, _ = call(api_svc, "POST", "/runs", {"workspace": "ws_control", "flow": "nothing"})
    assert status == 400 and "no flow 'nothing'" in payload["message"]


def test_without_a_drive_starter_a_start_is_a_503_and_nothing_is_written(api_svc: Services) -> None:
    api_svc.drives = None

    status, payload, _ = call(api_svc, "POST", "/runs", START)

    assert status == 503 and payload["message"] == "this deployment cannot start drives"
    assert api_svc.store.list_runs("acme") == []


def test_an_unexpected_error_is_a_500_with_a_generic_message_never_its_details(api_svc: Services) -> None:
    class Broken:
        def start(self, tenant: str, run_id: str) -> str:
            raise RuntimeError("boom at /home/ops/.aws/credentials secret=hunter2")

    api_svc.drives = Broken()

    status, payload, _ = call(api_svc, "POST", "/runs", START)

    assert status == 500 and payload == {"message": GENERIC_ERROR, "problems": []}


# -- reading -----------------------------------------------------------------------------------


def test_list_shows_the_callers_runs_newest_first_up_to_the_limit_and_get_shows_the_steps(api_svc: Services) -> None:
    ids = [start(api_svc)["id"] for _ in range(3)]

    status, payload, _ = call(api_svc, "GET", "/runs")
    assert status == 200 and [r["id"] for r in payload["runs"]] == ids[::-1]
    assert "steps" not in payload["runs"][0]

    status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": "2"})
    assert [r["id"] for r in payload["runs"]] == ids[:0:-1]

    status, run, _ = call(api_svc, "GET", f"/runs/{ids[0]}")
    assert status == 200 and run["id"] == ids[0]
    assert [(s["index"], s["status"]) for s in run["steps"]] == [(0, "pending"), (1, "pending"), (2, "pending")]


def test_a_limit_that_is_not_a_positive_number_is_a_400_naming_it(api_svc: Services) -> None:
    for bad in ("abc", "0"):
        status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": bad})
        assert status == 400 and problem_fields(payload) == {"limit"}


def test_another_tenants_run_is_a_404_exactly_like_a_missing_one_for_get_stop_and_approval(api_svc: Services) -> None:
    theirs = start(api_svc, tenant="acme")["id"]
    missing = "run-20000101-000000-000000"

    for method, suffix, body in (("GET", "", None), ("POST", "/stop", None), ("POST", "/approval", {"approve": True})):
        seen = call(api_svc, method, f"/runs/{theirs}{suffix}", body, tenant="globex")
        absent = call(api_svc, method, f"/runs/{missing}{suffix}", body, tenant="globex")
        assert seen[0] == absent[0] == 404
        assert seen[1]["message"].replace(theirs, "ID") == absent[1]["message"].replace(missing, "ID")

    assert call(api_svc, "GET", "/runs", tenant="globex")[1] == {"runs": [], "next": None, "searched": 0}
    untouched = api_svc.store.get_run("acme", theirs, steps=False)
    assert not untouched.stop_requested and untouched.status == RunStatus.queued
    assert len(started_drives(api_svc)) == 1


def test_no_identity_is_a_401_on_every_run_route(api_svc: Services) -> None:
    for method, path, body in (
        ("POST", "/runs", START),
        ("GET", "/runs", None),
        ("GET", "/runs/run-x", None),
        ("POST", "/runs/run-x/stop", None),
        ("POST", "/runs/run-x/approval", {"approve": True}),
    ):
        status, payload, _ = call(api_svc, method, path, body, tenant=None)
        assert status == 401, (method, path)
        assert "identity" in payload["message"]
    assert started_drives(api_svc) == []


def test_a_cognito_callers_tenant_claim_wins_over_the_account_id(api_svc: Services) -> None:
    run = start(api_svc, tenant="123456789012", cognito="acme")

    assert run["tenant"] == "acme"
    assert call(api_svc, "GET", f"/runs/{run['id']}", tenant=None, cognito="acme")[0] == 200
    assert call(api_svc, "GET", f"/runs/{run['id']}", tenant="123456789012")[0] == 404


# -- stop and approvals ------------------------------------------------------------------------


def test_stop_closes_a_queued_run_at_once_and_a_second_stop_says_already(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/stop")
    assert status == 200 and payload["message"] == f"run {run_id} stopped"
    assert payload["run"]["status"] == "failed" and payload["run"]["stop_requested"] is True

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/stop")
    assert status == 200 and "already stopped" in payload["message"]


def test_approving_a_parked_run_continues_it_in_a_new_drive_to_completion(api_svc: Services) -> None:
    # Given a run really driven (the embedded engine, the real definition) to its approval,
    api_svc.drives = RecordingDrives(local_engine(api_svc))
    run_id = start(api_svc)["id"]
    status, parked, _ = call(api_svc, "GET", f"/runs/{run_id}")
    assert parked["status"] == "awaiting-approval" and parked["steps"][1]["status"] == "awaiting-approval"

    # when a person approves it,
    status, answered, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": True})

    # then a second drive is started and carries it to the end.
    assert status == 200 and answered["id"] == run_id and answered["status"] == "queued"
    assert started_drives(api_svc) == [("acme", run_id), ("acme", run_id)]
    done = api_svc.store.get_run("acme", run_id)
    assert done.status == RunStatus.completed and done.drives == 2
    assert [s.status for s in done.steps] == [StepStatus.completed] * 3
    # the record the viewer shows: costs and prompt-layer sizes per step
    _, shown, _ = call(api_svc, "GET", f"/runs/{run_id}")
    assert shown["steps"][0]["prompt_layers"] and all(layer["chars"] > 0 for layer in shown["steps"][0]["prompt_layers"])


def _parked_run(svc: Services, tenant: str = "acme") -> str:
    """A run parked at its approval, driven there by the embedded engine."""
    run = prepare_run(svc, FIXTURES / "ws_control", "approval", tenant=tenant)
    svc.store.create_run(run)
    assert local_engine(svc).drive(tenant, run.id, tick_s=0.02).run.status == RunStatus.awaiting_approval
    return run.id


def test_rejecting_a_parked_run_fails_it_and_starts_no_drive(api_svc: Services) -> None:
    run_id = _parked_run(api_svc)

    status, run, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": False})

    assert status == 200 and run["status"] == "failed" and run["error"] == "rejected by a person"
    assert started_drives(api_svc) == []


def test_answering_a_run_that_is_not_waiting_is_a_409(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]

    status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": True})

    assert status == 409 and "not waiting for an approval" in payload["message"]
    assert len(started_drives(api_svc)) == 1


def test_an_approval_answer_must_be_a_boolean(api_svc: Services) -> None:
    for body in ({}, {"approve": "yes"}, {"approve": True, "note": "x"}):
        status, payload, _ = call(api_svc, "POST", "/runs/run-x/approval", body)
        assert status == 400 and problem_fields(payload) & {"approve", "note"}
