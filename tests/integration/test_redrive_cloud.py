"""A redrive on the cloud path, under moto: a run started through the API handler with an API
Gateway event fails on the DynamoDB store with its workspace in S3; `POST /runs/{id}/redrive`
through the same handler starts a second execution of the same state machine, which carries
the completed step and completes the run."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from helpers import write_workspace
from integration.test_cloud_path import URL, api_event, cloud, handler, record_of, start
from integration.test_redrive import AGENTS, FLOWS

from laneflow.adapters.store import open_store
from laneflow.ports import Services
from laneflow.wiring import local_engine

__all__ = ["cloud"]  # the fixture, taken from the cloud path's tests

TENANT = "123456789012"


class Executions:
    """Starts each drive as StartExecution would (and waits for it), keeping its execution."""

    def __init__(self, svc: Services) -> None:
        self.svc, self.started, self.executions = svc, [], []  # type: ignore[var-annotated]

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append(run_id)
        arn = local_engine(self.svc).drive(tenant, run_id, tick_s=0.02).execution_arn
        self.executions.append(arn)
        return arn


@pytest.mark.slow
def test_a_failed_run_redriven_through_the_api_handler_completes_in_a_second_execution(cloud: Services, tmp_path: Path) -> None:
    ws = write_workspace(tmp_path / "desk", AGENTS, FLOWS)
    s3 = boto3.client("s3", region_name="us-east-1")
    for path in ws.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "laneflow-blobs", f"workspaces/{TENANT}/desk/{path.relative_to(ws).as_posix()}")
    drives = cloud.drives = Executions(cloud)
    api = handler("api")

    # Given a run started through the API whose second step failed
    run_id = start(api, {"workspace": "desk", "flow": "desk"})
    failed = record_of(api, run_id)
    assert failed["status"] == "failed" and failed["error"] == "step 1 (writer) failed: the writer crashed"
    kept = failed["steps"][0]

    # When it is redriven through the API handler
    event = api_event("redrive_run", pathParameters={"run_id": run_id}, path=f"/runs/{run_id}/redrive")
    answer = api(event, None)

    # Then a second execution of the same state machine drove it to completion
    assert answer["statusCode"] == 200, answer["body"]
    assert json.loads(answer["body"]) == record_of(api, run_id)  # the record, as GET answers it
    first, second = drives.executions
    machine = first.rsplit(":", 1)[0]
    assert drives.started == [run_id, run_id] and second != first and second.rsplit(":", 1)[0] == machine
    record = record_of(api, run_id)
    assert record["status"] == "completed" and (record["redrives"], record["drives"]) == (1, 2)
    assert record["execution"] == second and record["tenant"] == TENANT
    assert record["steps"][0] == kept  # carried, not re-run
    writer = record["steps"][1]
    assert writer["attempts"] == 2 and writer["result"] == "Draft two."
    assert "This run was redriven after it failed: step 1 (writer) failed: the writer crashed." in writer["message"]
    stored = open_store(URL).get_run(TENANT, run_id)  # in DynamoDB: a fresh store reads it
    assert stored.redrives == 1 and stored.status == "completed"
    assert cloud.told == [run_id, run_id]  # type: ignore[attr-defined]  # "run finished" went to the bus both times

    # A second redrive of the completed run is a 409 naming why, and starts nothing.
    again = api(event, None)
    assert again["statusCode"] == 409 and "completed: there is nothing to redrive" in json.loads(again["body"])["message"]
    assert len(drives.started) == 2
