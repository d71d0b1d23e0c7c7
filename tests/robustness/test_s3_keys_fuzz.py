"""A workspace in S3 (moto), given any set of keys: it is laid out as a folder holding exactly
its files, each with its own bytes, or it is refused before anything is downloaded, with the
library's 400 naming one of its keys; never another exception, never a half-made folder."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from laneflow.adapters.aws import s3 as workspaces
from laneflow.adapters.aws.s3 import local_path
from laneflow.domain.errors import WorkspaceInvalid

BUCKET = "laneflow-fuzz"

# Name parts S3 takes and a file system may not: empty, `.`, `..`, 255 bytes (it fits) and
# 256 (it does not), in ASCII and in two-byte characters, next to ordinary names.
PARTS = st.sampled_from(
    [
        "a",
        "b",
        "notes.md",
        "scripts",
        "storage",
        "",
        ".",
        "..",
        " ",
        "x" * 255,
        "x" * 256,
        "é" * 127 + "x",
        "é" * 128,
        "a\\b",
        "%2e%2e",
    ]
)
KEYS = st.builds(
    lambda parts, marker: "/".join(parts) + ("/" if marker else ""), st.lists(PARTS, min_size=1, max_size=3), st.booleans()
)

_counter = itertools.count()
_RUN = uuid.uuid4().hex[:8]  # downloads are kept under /tmp by URI: this session's are its own
_homes: list[Any] = []  # what the downloads made, removed at the end


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
    for home in _homes:
        shutil.rmtree(home, ignore_errors=True)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def can_be_laid_out(rels: list[str]) -> bool:
    """Whether these keys (relative to the workspace) are files of one folder, said without
    the library: no absolute, empty, `.` or `..` part, no name past 255 bytes, and no file
    that another key needs as a folder."""
    files, folders = set(), set()
    for rel in rels:
        if rel == "":
            continue
        parts = rel.removesuffix("/").split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(len(p.encode()) > 255 for p in parts):
            return False
        folders |= {"/".join(parts[:n]) for n in range(1, len(parts) + rel.endswith("/"))}
        if not rel.endswith("/"):
            files.add(rel)
    return not files & folders


@settings(max_examples=120)
@given(st.lists(KEYS, min_size=1, max_size=5, unique=True))
def test_any_set_of_keys_is_laid_out_whole_or_refused_naming_a_key_before_anything_is_written(s3: Any, rels: Any) -> None:
    name = f"ws-{_RUN}-{next(_counter)}"
    prefix = f"workspaces/acme/{name}/"
    for rel in rels:
        s3.put_object(Bucket=BUCKET, Key=prefix + rel, Body=rel.encode())
    uri = f"s3://{BUCKET}/{prefix}"
    home = workspaces.CACHE / hashlib.sha256(uri.encode()).hexdigest()[:16]
    _homes.append(home)

    try:
        folder = local_path(uri, s3)
    except WorkspaceInvalid as refused:
        assert refused.http_status == 400 and not can_be_laid_out(rels), (rels, str(refused))
        assert any(repr(rel) in str(refused) for rel in rels), str(refused)
        assert not home.exists()  # nothing was downloaded, no staging folder left
        return
    assert can_be_laid_out(rels), rels
    files = {rel for rel in rels if rel and not rel.endswith("/")}
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert on_disk == files
    assert all((folder / rel).read_bytes() == rel.encode() for rel in files)
    assert [p.name for p in home.iterdir() if p.name.endswith(".partial")] == []
