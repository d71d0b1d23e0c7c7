"""Captures in the cloud go to S3, and nothing is written to the process's working folder
(Lambda's /var/task is read-only): proven on the cloud path under moto with the working
folder made read-only, through the services the handlers build from settings alone."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from helpers import EXAMPLES, data_of, moto_dynamodb_serialized
from moto import mock_aws
from test_cloud_path import SyncDrives, api_event, handler

from laneflow.adapters.aws import s3 as workspaces
from laneflow.adapters.aws.s3 import S3Captures
from laneflow.adapters.local.captures import FolderCaptures
from laneflow.adapters.local.on_end import LocalOnEnd
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.settings import Settings
from laneflow.wiring import capture_sink, for_store, install

URL = "dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1"
TENANT = "123456789012"


@pytest.fixture
def read_only_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The working folder is a chmod 0555 folder (tests run as root, which ignores the mode:
    the test also checks that nothing appeared in it)."""
    cwd = tmp_path / "var-task"
    cwd.mkdir()
    cwd.chmod(0o555)
    monkeypatch.chdir(cwd)
    yield cwd
    cwd.chmod(0o755)


@pytest.mark.slow
def test_a_step_with_tool_calls_captures_to_s3_and_writes_nothing_to_a_read_only_working_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, read_only_cwd: Path
) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))  # the process's temp folder (Lambda: /tmp)
    monkeypatch.setattr(workspaces, "CACHE", temp / "laneflow-workspaces")
    monkeypatch.setattr(workspaces, "ATTEMPTS", temp / "laneflow-attempts")
    with mock_aws(), moto_dynamodb_serialized():
        init_store(URL)
        s3 = boto3.client("s3", region_name="us-east-1")
        for path in (EXAMPLES / "newsroom").rglob("*"):
            if path.is_file():
                s3.upload_file(
                    str(path),
                    "laneflow-blobs",
                    f"workspaces/{TENANT}/newsroom/{path.relative_to(EXAMPLES / 'newsroom').as_posix()}",
                )
        # As a handler builds them from its environment: no capture folder, no event bus.
        svc = for_store(open_store(URL), Settings(store_url=URL, workspaces="s3://laneflow-blobs/workspaces"))
        assert isinstance(svc.captures, S3Captures) and isinstance(svc.on_end, LocalOnEnd)
        svc.drives = SyncDrives(svc)
        install(svc)
        try:
            body = {"workspace": "newsroom", "flow": "brief", "input": {"topics": ["tides"]}}
            started = handler("api")(api_event("start_run", body=json.dumps(body)), None)
            assert started["statusCode"] == 201, started["body"]
            run_id = json.loads(started["body"])["id"]
            run = svc.store.get_run(TENANT, run_id)
        finally:
            install(None)
        assert run.status == "completed", run.error

        # The researcher's `call:` lines were captured in S3, under the tenant and the run.
        tools = [e for e in run.steps[0].events if e.type == "tool"]
        assert [data_of(e)["tool"] for e in tools] == ["list_files", "read_file"]
        for event in tools:
            ref = data_of(event)["capture"]
            assert ref.startswith(f"{TENANT}/{run_id}/")
            captured = json.loads(s3.get_object(Bucket="laneflow-blobs", Key=f"captures/{ref}")["Body"].read())
            assert captured["tool"] == data_of(event)["tool"] and captured["output"]

    # Nothing was written to the working folder; the on-end log went to the temp folder.
    assert os.listdir(read_only_cwd) == []
    assert json.loads((temp / "laneflow" / "events.jsonl").read_text().splitlines()[-1])["run_id"] == run_id


def test_captures_follow_the_capture_folder_else_a_bucket_named_or_in_use_else_beside_the_store(tmp_path: Path) -> None:
    sqlite = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    assert isinstance(capture_sink(sqlite, Settings(capture_dir=str(tmp_path / "c"))), FolderCaptures)
    named = capture_sink(sqlite, Settings(capture_bucket="captures-bucket"))
    assert isinstance(named, S3Captures) and named.bucket == "captures-bucket"
    from_workspaces = capture_sink(sqlite, Settings(workspaces="s3://workspaces-bucket/workspaces"))
    assert isinstance(from_workspaces, S3Captures) and from_workspaces.bucket == "workspaces-bucket"
    beside = capture_sink(sqlite, Settings())
    assert isinstance(beside, FolderCaptures) and beside.root == tmp_path / "captures"
    with mock_aws():
        dynamo = open_store("dynamodb://laneflow-runs?bucket=laneflow-blobs&region=us-east-1")
        assert capture_sink(dynamo, Settings()).bucket == "laneflow-blobs"  # type: ignore[attr-defined]
        assert capture_sink(dynamo, Settings(capture_bucket="captures-bucket")).bucket == "captures-bucket"  # type: ignore[attr-defined]
