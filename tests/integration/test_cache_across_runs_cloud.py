"""The prompt cache across runs on the cloud path, under moto: three runs of one Claude flow
started through the API handler at once, each driven through the deployed definition on the
DynamoDB store with the workspace in S3, pay one cold prefix between them (counted by the
Messages API imitation); the runs whose lead waited for the writer say which run it was."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import FIXTURES, moto_dynamodb_serialized
from integration.test_cloud_path import URL, handler, record_of, start
from moto import mock_aws
from pydantic import SecretStr

from laneflow.adapters.aws.s3 import S3Workspaces
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.adapters.store.provision import init_store
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, install, local_engine
from laneflow_dev.imitation import MessagesImitation

KEY = "sk-test-0123456789abcdef"
TENANT = "123456789012"


class ThreadDrives:
    """Starts each drive as StartExecution would, on a thread of its own: drives run at once."""

    def __init__(self, svc: Services) -> None:
        self.svc, self.threads = svc, []  # type: ignore[var-annotated]

    def start(self, tenant: str, run_id: str) -> str:
        th = threading.Thread(target=lambda: local_engine(self.svc).drive(tenant, run_id, tick_s=0.02))
        th.start()
        self.threads.append(th)
        return f"arn:aws:states:us-east-1:{TENANT}:execution:flow:{run_id}"

    def join(self) -> None:
        for th in self.threads:
            th.join(timeout=120)


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Services, MessagesImitation]]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with MessagesImitation(ttft_ms=400, token_ms=1, api_keys={KEY}) as api, mock_aws(), moto_dynamodb_serialized():
        assert "created" in " ".join(init_store(URL))
        s3 = boto3.client("s3", region_name="us-east-1")
        root = FIXTURES / "ws_claude"
        for path in root.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "laneflow-blobs", f"workspaces/{TENANT}/claude/{path.relative_to(root).as_posix()}")
        settings = Settings(store_url=URL, tenant=TENANT, anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url)
        svc = for_store(open_store(URL), settings)
        svc.workspaces = S3Workspaces("laneflow-blobs")
        svc.drives = ThreadDrives(svc)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
        install(svc)
        yield svc, api
        install(None)


@pytest.mark.slow
def test_a_burst_of_runs_through_the_api_pays_one_cold_prefix_on_the_cloud_path(
    cloud: tuple[Services, MessagesImitation],
) -> None:
    svc, api = cloud
    handle = handler("api")
    ids = [start(handle, {"workspace": "claude", "flow": "fanout"}) for _ in range(3)]
    svc.drives.join()  # type: ignore[union-attr]
    records: list[dict[str, Any]] = [record_of(handle, run_id) for run_id in ids]
    assert [r["status"] for r in records] == ["completed"] * 3, [r.get("error") for r in records]
    assert api.stats()["cache_writes"] == 1, api.stats()
    writer = [r["id"] for r in records if any(s["calls"][0]["tokens"]["cache_write"] for s in r["steps"])]
    assert len(writer) == 1
    lines = [e["text"] for r in records for e in r["steps"][0]["events"] if e["type"] == "gate"]
    others = [line for line in lines if writer[0] in line]
    assert len(others) >= 2, lines  # each other run's lead waited for it, or found it warm from it
