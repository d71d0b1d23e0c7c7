"""Where workspaces are, by name: a local folder of workspaces (`laneflow serve`), or an S3
prefix in the cloud, synced into /tmp by content so a Lambda reads it like a folder.

A run keeps its workspace's URI (`workspace_uri`): a local path, or `s3://bucket/prefix/name/`.
`local_path` turns either into a folder every reader can use.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from .errors import NotFound

CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "laneflow-workspaces"
_lock = threading.Lock()


class WorkspaceNotFound(NotFound):
    def __init__(self, name: str):
        super().__init__(f"no workspace {name!r}")


class WorkspaceSource(Protocol):
    def locate(self, name: str) -> str:
        """The URI of the workspace called `name`; WorkspaceNotFound if there is none."""


class FolderWorkspaces:
    """Workspaces are the sub-folders of one folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def locate(self, name: str) -> str:
        if not name or "/" in name or name.startswith("."):
            raise WorkspaceNotFound(name)
        path = self.root / name
        if not path.is_dir():
            raise WorkspaceNotFound(name)
        return str(path)


class S3Workspaces:
    """Workspaces under `s3://bucket/prefix/<name>/`."""

    def __init__(self, bucket: str, prefix: str = "workspaces", client: Any | None = None):
        self.bucket, self.prefix, self._client = bucket, prefix.strip("/"), client

    def locate(self, name: str) -> str:
        if not name or "/" in name:
            raise WorkspaceNotFound(name)
        uri = f"s3://{self.bucket}/{self.prefix}/{name}/"
        if not _objects(uri, self._client):
            raise WorkspaceNotFound(name)
        return uri


def _s3(client: Any | None) -> Any:
    if client is not None:
        return client
    import boto3

    return boto3.client("s3")


def _objects(uri: str, client: Any | None = None) -> list[dict[str, Any]]:
    parsed = urlparse(uri)
    s3 = _s3(client)
    out, token = [], None
    while True:
        args = {"Bucket": parsed.netloc, "Prefix": parsed.path.lstrip("/")}
        if token:
            args["ContinuationToken"] = token
        page = s3.list_objects_v2(**args)
        out += page.get("Contents", [])
        if not page.get("IsTruncated"):
            return out
        token = page.get("NextContinuationToken")


def local_path(uri: str, client: Any | None = None) -> Path:
    """A folder holding the workspace: the path itself, or the S3 prefix synced into a
    folder named by its content (ETags), so an unchanged workspace is downloaded once."""
    if not uri.startswith("s3://"):
        return Path(uri)
    parsed = urlparse(uri)
    prefix = parsed.path.lstrip("/")
    objects = _objects(uri, client)
    digest = hashlib.sha256("".join(f"{o['Key']}:{o['ETag']}" for o in sorted(objects, key=lambda o: o["Key"])).encode()).hexdigest()[:16]
    target = CACHE / f"{Path(prefix.rstrip('/')).name}-{digest}"
    with _lock:
        if not target.is_dir():
            s3 = _s3(client)
            staging = target.with_name(target.name + f".{os.getpid()}.partial")
            for obj in objects:
                rel = obj["Key"][len(prefix):]
                if not rel or rel.endswith("/"):
                    continue
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(parsed.netloc, obj["Key"], str(dest))
            staging.mkdir(parents=True, exist_ok=True)
            staging.rename(target)
    return target
