"""Against a deployed stack (`sam deploy`): set LANEFLOW_E2E_API to the stack's ApiUrl output
(with AWS credentials of the account, and examples/newsroom synced to
s3://BUCKET/workspaces/ACCOUNT_ID/newsroom/, the caller's tenant). Skipped without one."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

import pytest

API = os.environ.get("LANEFLOW_E2E_API", "").rstrip("/")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not API, reason="no deployed stack (set LANEFLOW_E2E_API to its ApiUrl)")]


def signed(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """An IAM-signed (SigV4) request, as the API's authorization requires."""
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    session = boto3.Session()
    data = json.dumps(body).encode() if body is not None else None
    request = AWSRequest(method=method, url=API + path, data=data, headers={"Content-Type": "application/json"})
    SigV4Auth(session.get_credentials(), "execute-api", session.region_name or "us-east-1").add_auth(request)  # type: ignore[arg-type]
    req = urllib.request.Request(API + path, data=data, method=method, headers=dict(request.headers))
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_a_run_started_on_the_deployed_api_runs_to_its_end() -> None:
    status, run = signed("POST", "/runs", {"workspace": "newsroom", "flow": "brief", "input": {"topics": ["tides", "kelp"]}})
    assert status == 201, run
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status, record = signed("GET", f"/runs/{run['id']}")
        if record.get("status") in ("completed", "failed"):
            break
        time.sleep(5)
    assert record["status"] == "completed", record.get("error")
    assert all(step["status"] == "completed" for step in record["steps"])


def test_a_malformed_start_is_a_400_naming_the_field() -> None:
    status, body = signed("POST", "/runs", {"workspace": "newsroom"})
    assert status == 400 and "flow" in body["message"]
