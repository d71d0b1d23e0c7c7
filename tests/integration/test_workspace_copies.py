"""A workspace in S3 (moto): each attempt works in its own copy under /tmp, removed when the
attempt ends; a completed attempt's writes to its agent's outputs/ and memory/ and the
workspace's storage/ and state/ go back to the tenant's prefix, a failed one keeps nothing;
an S3 key that would land outside the workspace's folder refuses the download.

Steps run on Claude's executor against the local Messages API imitation, so their file tools
really read and write the attempt's copy; the real definition drives them on the local engine.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import data_of
from moto import mock_aws
from pydantic import SecretStr

from laneflow.adapters.aws import s3 as workspaces
from laneflow.adapters.aws.s3 import S3Workspaces, local_path
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.records import Run, RunStatus
from laneflow.settings import Settings
from laneflow.usecases.start_run import prepare_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation, Reply

BUCKET, TENANT = "laneflow-blobs", "acme"
PREFIX = f"workspaces/{TENANT}/desk/"
KEY = "sk-test-copies-0123456789"

DESK = {
    "AGENTS.md": "---\nmodel: claude-sonnet-4-6\n---\nThe desk.\n",
    "agents/clerk/agent.md": "---\ndescription: Files things.\nmax_turns: 8\n---\nYou are the clerk.\n",
    "storage/notes.md": "the notes\n",
    "flows/file.yaml": ("steps:\n  - agent: clerk\n    instruction: File the notes.\n    output: json\n"),
    "flows/fail.yaml": (
        "steps:\n"
        "  - agent: clerk\n"
        "    retries: 0\n"
        "    output: json\n"
        "    instruction: |\n"
        "      Draft, then answer without JSON.\n"
        '      [[tool write_file {"path": "storage/draft.md", "content": "a draft"}]]\n'
        "      [[reply no JSON here]]\n"
    ),
}

# What the second attempt of `file` writes, and whether it outlives the attempt.
WRITES = {
    "storage/final.md": True,
    "state/cursor.md": True,
    "agents/clerk/outputs/work.md": True,
    "agents/clerk/memory/learned.md": True,
    "agents/clerk/notes.md": False,  # its own folder, but not outputs/ or memory/
    "memory/shared.md": False,  # the workspace's memory/ is not among what is kept
}


def write(path: str) -> dict[str, Any]:
    return {"name": "write_file", "input": {"path": path, "content": f"written to {path}"}}


class Clerk:
    """The model's side of `file`: attempt 1 drafts and answers without JSON (a retryable
    failure); attempt 2 lists storage/, writes WRITES, and answers JSON. It notes what it
    sees on disk and in its system prompt as it is called, i.e. while each attempt runs."""

    def __init__(self) -> None:
        self.attempt = 0
        self.folders_during: list[list[str]] = []
        self.systems: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turn == 0:
            self.attempt += 1
        attempts = workspaces.ATTEMPTS
        self.folders_during.append(sorted(p.name for p in attempts.iterdir()) if attempts.is_dir() else [])
        self.systems.append(" ".join(block["text"] for block in body["system"]))
        if self.attempt == 1:
            if turn == 0:
                return Reply(text="Drafting.", tool_uses=[write("storage/draft.md")])
            return Reply(text="Here is my answer, in prose.")
        if turn == 0:
            return Reply(text="Looking.", tool_uses=[{"name": "list_files", "input": {"path": "storage"}}])
        if turn == 1:
            return Reply(text="Filing.", tool_uses=[write(path) for path in WRITES])
        return Reply(text='Filed.\n```json\n{"filed": true}\n```')


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(workspaces, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(workspaces, "ATTEMPTS", tmp_path / "attempts")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for rel, body in DESK.items():
            s3.put_object(Bucket=BUCKET, Key=PREFIX + rel, Body=body.encode())
        yield s3


def drive(s3: Any, tmp_path: Path, flow: str, responder: Any = None) -> Run:
    """Start a run of the tenant's S3 workspace as the API does, and drive it to its end."""
    with MessagesImitation(ttft_ms=5, token_ms=0, api_keys={KEY}, responder=responder) as model:
        settings = Settings(
            anthropic_api_key=SecretStr(KEY), anthropic_base_url=model.url, capture_dir=str(tmp_path / "captures")
        )
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'runs.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=model.url, backoff_s=0.01)
        uri = S3Workspaces(BUCKET).locate(TENANT, "desk")
        run = prepare_run(svc, local_path(uri), flow, tenant=TENANT)
        run.workspace_uri = uri
        svc.store.create_run(run)
        local_engine(svc).drive(TENANT, run.id, tick_s=0.02)
        return svc.store.get_run(TENANT, run.id)


def stored(s3: Any) -> dict[str, str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", [])
    return {o["Key"][len(PREFIX) :]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read().decode() for o in found}


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_each_attempt_works_in_its_own_copy_and_only_a_completed_one_keeps_its_files(cloud: Any, tmp_path: Path) -> None:
    clerk = Clerk()
    run = drive(cloud, tmp_path, "file", clerk)
    assert run.status == RunStatus.completed, run.error
    step = run.steps[0]
    assert step.attempts == 2

    # Each attempt had one private folder while it ran: the first one's was gone before the second began.
    first, second = clerk.folders_during[0], clerk.folders_during[2]
    assert len(first) == 1 and len(second) == 1 and first != second
    # The retry started clean: attempt 1's draft was not in its copy.
    listing = next(e for e in step.events if e.type == "tool" and data_of(e)["tool"] == "list_files")
    seen = (tmp_path / "captures" / data_of(listing)["capture"]).read_text()
    assert "storage/notes.md" in seen and "draft.md" not in seen

    # Only what the completed attempt wrote in the kept folders went back to S3; the failed
    # attempt's draft did not, and nothing else was added.
    after = stored(cloud)
    assert set(after) == set(DESK) | {path for path, kept in WRITES.items() if kept}
    assert all(after[path] == f"written to {path}" for path, kept in WRITES.items() if kept)
    kept = next(e for e in step.events if e.text.startswith("kept in the workspace"))
    assert data_of(kept)["kept"] == sorted(path for path, k in WRITES.items() if k)

    # No copy is left behind, and the shared download was never written.
    assert files_under(workspaces.ATTEMPTS) == []
    assert {Path(f).name for f in files_under(workspaces.CACHE)} == {Path(f).name for f in DESK}
    # The step's prompt names the workspace, not the folder it was copied to.
    assert all("workspace `desk`" in system for system in clerk.systems)


def test_a_failed_attempt_keeps_nothing_in_the_workspace(cloud: Any, tmp_path: Path) -> None:
    before = stored(cloud)
    run = drive(cloud, tmp_path, "fail")
    assert run.status == RunStatus.failed and "not valid JSON" in (run.steps[0].error or "")
    assert any(e.type == "tool" and data_of(e)["tool"] == "write_file" for e in run.steps[0].events)  # it did write
    assert stored(cloud) == before
    assert files_under(workspaces.ATTEMPTS) == []


@pytest.mark.parametrize("escape", ["../../escaped.md", "ABSOLUTE"], ids=["dot-dot", "absolute"])
def test_an_s3_key_that_escapes_the_workspace_folder_is_refused_and_nothing_is_downloaded(
    cloud: Any, tmp_path: Path, escape: str
) -> None:
    outside = tmp_path / "escaped.md"
    rel = "/" + str(outside).lstrip("/") if escape == "ABSOLUTE" else escape
    cloud.put_object(Bucket=BUCKET, Key=PREFIX + rel, Body=b"written outside")
    uri = S3Workspaces(BUCKET).locate(TENANT, "desk")
    with pytest.raises(WorkspaceInvalid) as refused:
        local_path(uri)
    assert repr(rel) in str(refused.value) and "outside the workspace's folder" in str(refused.value)
    assert not outside.exists() and files_under(workspaces.CACHE) == []
    assert not (workspaces.CACHE / "escaped.md").exists() and not (workspaces.CACHE.parent / "escaped.md").exists()


def test_the_copies_folders_are_this_users_own_and_one_another_user_made_or_a_link_is_refused(tmp_path: Path) -> None:
    assert workspaces.ATTEMPTS.name.endswith(f"-{os.geteuid()}") and workspaces.CACHE.name.endswith(f"-{os.geteuid()}")
    made = workspaces.own_folder(tmp_path / "mine")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="link.* is not this user's own folder"):
        workspaces.own_folder(tmp_path / "link")
    if os.geteuid() == 0:  # only root can give a folder away
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError, match="made by uid 65534"):
            workspaces.own_folder(theirs)
