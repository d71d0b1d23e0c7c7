"""Where workspaces are, by tenant and name, and the folder one attempt works in.

- `FolderWorkspaces`: the sub-folders of one local folder (`laneflow serve`).
- `S3Workspaces`: each tenant's own prefix, `s3://bucket/workspaces/<tenant>/<name>/`.

A run keeps its workspace's URI (`workspace_uri`): a local path, or an S3 prefix.
`local_path` turns either into a folder to read: the path itself, or a pristine download of
the prefix, cached under /tmp by content and only ever read. `checkout` gives one attempt
the folder it reads and writes: for an S3 workspace, a private copy of the pristine
download. When the attempt completes, what it created or changed under its agent's
`outputs/` and `memory/` and the workspace's `storage/` and `state/` (`changed`) is uploaded
back to the tenant's prefix (`keep`); `discard` removes the copy however the attempt ended.
A local workspace is worked in in place (keep and discard change nothing).
"""

from __future__ import annotations

import errno
import filecmp
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from laneflow.domain.errors import Problem, WorkspaceInvalid, WorkspaceNotFound
from laneflow.domain.redaction import Redactor
from laneflow.domain.tenants import check_tenant

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import ListObjectsV2RequestTypeDef, ObjectTypeDef


class S3Captures:
    """Captures as JSON objects at `s3://<bucket>/<prefix>/<tenant>/<run_id>/<key>.json`,
    masked by `redactor` (the store's) as they are written.

    The reference returned (and kept on the tool event) is the part after the prefix, as
    with `FolderCaptures`. The client is made on first use, once (boto3's usual settings;
    `region` overrides the region)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "captures",
        *,
        region: str | None = None,
        client: S3Client | None = None,
        redactor: Redactor | None = None,
    ):
        self.bucket, self.prefix, self.region = bucket, prefix.strip("/"), region
        self.redactor = redactor
        self._client = client
        self._lock = threading.Lock()

    def _s3(self) -> S3Client:
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.session.Session().client("s3", region_name=self.region)
            return self._client

    def key(self, ref: str) -> str:
        """The S3 key of a capture reference."""
        return f"{self.prefix}/{ref}" if self.prefix else ref

    def put(self, tenant: str, run_id: str, key: str, record: dict[str, Any]) -> str:
        rel = f"{check_tenant(tenant)}/{run_id}/{key}.json"
        if self.redactor is not None:
            record = self.redactor.value(record)
        body = json.dumps(record, ensure_ascii=False).encode("utf-8")
        self._s3().put_object(Bucket=self.bucket, Key=self.key(rel), Body=body, ContentType="application/json")
        return rel

    def get(self, ref: str) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(
            self._s3().get_object(Bucket=self.bucket, Key=self.key(ref))["Body"].read().decode("utf-8")
        )
        return record


# Both folders are this user's own (named by its uid, made 0700, refused when another user
# made them first or one is a link): a shared /tmp is every user's, and a folder another made
# could be read, filled or swapped under laneflow.
CACHE = Path(tempfile.gettempdir()) / f"laneflow-workspaces-{os.geteuid()}"  # pristine downloads, read only

ATTEMPTS = Path(tempfile.gettempdir()) / f"laneflow-attempts-{os.geteuid()}"  # one folder per running attempt

DOWNLOAD_FORMAT = "scripts-executable\n"

PRUNE_AFTER_S = 600.0  # a superseded download unused this long is removed

KEPT = ("storage", "state")  # the workspace's folders an attempt's writes outlive it in

KEPT_OWN = ("outputs", "memory")  # ... and its agent's

_lock = threading.Lock()


def _valid_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


class S3Workspaces:
    """Workspaces under `s3://bucket/prefix/<tenant>/<name>/`: a tenant finds only its own."""

    def __init__(self, bucket: str, prefix: str = "workspaces", client: S3Client | None = None):
        self.bucket, self.prefix, self._client = bucket, prefix.strip("/"), client

    def uri(self, tenant: str, name: str) -> str:
        """Where the tenant's workspace `name` is (whether or not it exists)."""
        return f"s3://{self.bucket}/{self.prefix}/{check_tenant(tenant)}/{name}/"

    def locate(self, tenant: str, name: str) -> str:
        if not _valid_name(name):
            raise WorkspaceNotFound(name)
        uri = self.uri(tenant, name)
        if not _objects(uri, self._client):
            raise WorkspaceNotFound(name)
        return uri


def _s3(client: S3Client | None) -> S3Client:
    if client is not None:
        return client
    import boto3

    return boto3.client("s3")


def _split(uri: str) -> tuple[str, str]:
    """(bucket, key prefix ending in '/') of an `s3://bucket/prefix/` URI."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _objects(uri: str, client: S3Client | None = None) -> list[ObjectTypeDef]:
    bucket, prefix = _split(uri)
    s3 = _s3(client)
    out: list[ObjectTypeDef] = []
    token = None
    while True:
        args: ListObjectsV2RequestTypeDef = {"Bucket": bucket, "Prefix": prefix}
        if token:
            args["ContinuationToken"] = token
        page = s3.list_objects_v2(**args)
        out += page.get("Contents", [])
        if not page.get("IsTruncated"):
            return out
        token = page.get("NextContinuationToken")


def is_script(rel: str) -> bool:
    """A file directly in the workspace's or an agent's `scripts/` folder. S3 keeps no file
    modes, so a downloaded workspace's scripts are made executable (its script tools)."""
    parts = rel.split("/")
    return (len(parts) == 2 and parts[0] == "scripts") or (len(parts) == 4 and parts[0] == "agents" and parts[2] == "scripts")


NAME_MAX = 255  # bytes of one name in a path (Linux's file systems, /tmp among them)


def _refused(name: str, rel: str, why: str) -> WorkspaceInvalid:
    message = f"its S3 key {rel!r} {why}; nothing was downloaded"
    shown = rel.encode("utf-8", "backslashreplace").decode("utf-8")[:200]  # a Problem is JSON: no lone surrogate
    return WorkspaceInvalid(f"workspace {name!r}: {message}", [Problem(file=shown, message=message)])


def _key_problem(rel: str) -> str | None:
    """Why one key (relative to the workspace's prefix) cannot be laid out as a file of the
    workspace's folder, or None."""
    parts = rel.removesuffix("/").split("/")
    if rel.startswith("/") or ".." in parts or "\x00" in rel:
        return "would be written outside the workspace's folder (an absolute or '..' part)"
    if any(part in ("", ".") for part in parts):
        # `a//b` and `a/./b` are the file `a/b`: two keys would be one file
        return "has an empty or '.' part, so it would be the file of another key"
    try:
        sizes = [len(part.encode("utf-8")) for part in parts]
    except UnicodeEncodeError:
        return "is not UTF-8 text, so it cannot name a file"
    if max(sizes) > NAME_MAX:
        return f"has a name of {max(sizes)} bytes; a file or folder name is at most {NAME_MAX} bytes"
    return None


def _download_plan(name: str, prefix: str, objects: list[ObjectTypeDef]) -> list[tuple[str, str]]:
    """(key, relative path) of each file to download. A key that cannot be laid out as a
    file of the workspace's folder refuses the whole workspace, naming the key, before
    anything is downloaded: one that would land outside it (a `..` part, an absolute part:
    zip-slip), one whose name is too long for a file, one that would be another key's file
    (`a//b`), and a file that is also a folder (`notes.md` and `notes.md/inner.md`: S3
    holds both, a file system cannot)."""
    plan = []
    folders: dict[str, str] = {}  # each folder some key needs -> the first such key
    for obj in objects:
        rel = obj["Key"][len(prefix) :]
        if not rel:
            continue
        problem = _key_problem(rel)
        if problem is not None:
            raise _refused(name, rel, problem)
        parts = rel.removesuffix("/").split("/")
        for n in range(1, len(parts) + (rel.endswith("/"))):  # a folder marker (`a/`) needs its folder
            folders.setdefault("/".join(parts[:n]), rel)
        if not rel.endswith("/"):  # a folder marker holds nothing
            plan.append((obj["Key"], rel))
    for _, rel in plan:
        if rel in folders:
            raise _refused(name, rel, f"is a file, and the key {folders[rel]!r} needs a folder of that name")
    return plan


def local_path(uri: str, client: S3Client | None = None) -> Path:
    """A folder holding the workspace, to read: the path itself, or the S3 prefix downloaded
    into a folder named by its content (keys, ETags and sizes), so an unchanged workspace is
    downloaded once. The folder is named like the workspace (`.../<name>`), and is shared:
    nothing may write it (an attempt works in its own copy, `checkout`)."""
    if not uri.startswith("s3://"):
        return Path(uri)
    bucket, prefix = _split(uri)
    name = Path(prefix.rstrip("/")).name
    objects = sorted(_objects(uri, client), key=lambda o: o["Key"])
    # DOWNLOAD_FORMAT names how a download is laid out, so one made before a change of it
    # (scripts made executable) is never read as if it were made after.
    listing = DOWNLOAD_FORMAT + "".join(f"{o['Key']}:{o.get('ETag', '')}:{o.get('Size', '')}\n" for o in objects)
    home = CACHE / hashlib.sha256(uri.encode()).hexdigest()[:16]
    held = home / hashlib.sha256(listing.encode()).hexdigest()[:16]
    target = held / name
    plan = _download_plan(name, prefix, objects)  # refused whether or not a download of it is kept
    with _lock:
        if target.is_dir():
            os.utime(held)  # in use: not pruned while it is read
            return target
        own_folder(CACHE)
        staging = home / f".{held.name}.{os.getpid()}.{secrets.token_hex(4)}.partial"
        try:
            s3 = _s3(client)
            (staging / name).mkdir(parents=True)
            for i, (key, rel) in enumerate(plan):
                dest = staging / name / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                # Through a short name: the transfer writes `<name>.<8 characters>` first,
                # which a name of more than 246 bytes (that fits) would not fit.
                fetched = staging / f"{i}.part"
                s3.download_file(bucket, key, str(fetched))
                fetched.replace(dest)
                if is_script(rel):
                    dest.chmod(0o755)
            try:
                staging.rename(held)
            except OSError:  # another process downloaded the same content first
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        os.utime(held)
        _prune(home, keep=held)
    return target


def _prune(home: Path, keep: Path) -> None:
    """Remove the earlier downloads of one workspace that nobody used for PRUNE_AFTER_S (a
    Lambda container's /tmp would otherwise fill with one copy per change)."""
    cutoff = time.time() - PRUNE_AFTER_S
    for old in home.iterdir():
        try:
            if old != keep and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except FileNotFoundError:
            pass


@dataclass
class WorkingCopy:
    """The folder one attempt reads and writes (`root`, named like the workspace).

    For an S3 workspace it is the attempt's own copy of the pristine download: `keep`
    uploads what the attempt created or changed in the folders that outlive it, and
    `discard` removes the copy. For a local workspace it is the workspace itself."""

    root: Path
    uri: str
    pristine: Path | None = None  # None: a local workspace, worked in in place
    client: S3Client | None = None

    def changed(self, agent_path: str) -> list[str]:
        """What the attempt created or changed under its agent's `outputs/` and `memory/`
        and the workspace's `storage/` and `state/` (paths relative to the workspace).
        Symbolic links are never followed: only the copy's own regular files count."""
        if self.pristine is None:
            return []
        own = agent_path.strip("/")
        found = []
        for folder in [f"{own}/{sub}" for sub in KEPT_OWN] + list(KEPT):
            base = self.root / folder
            if not base.is_dir() or base.resolve() != self.root.resolve() / folder:
                continue  # missing, or reached through a link
            for where, _dirs, files in os.walk(base):
                for file in files:
                    path = Path(where) / file
                    if path.is_symlink() or not path.is_file():
                        continue
                    rel = path.relative_to(self.root).as_posix()
                    before = self.pristine / rel
                    if before.is_file() and filecmp.cmp(before, path, shallow=False):
                        continue
                    found.append(rel)
        return sorted(found)

    def keep(self, paths: list[str]) -> None:
        """Carry these files of the copy (what `changed` found) back to the workspace: to its
        S3 prefix, each at its own path, or into a local workspace's folder (a scratch copy);
        nothing for a local workspace worked in in place."""
        if self.pristine is None or not paths:
            return
        if not self.uri.startswith("s3://"):
            for rel in paths:
                dest = Path(self.uri) / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.root / rel, dest)
            return
        bucket, prefix = _split(self.uri)
        s3 = _s3(self.client)
        for rel in paths:
            s3.upload_file(str(self.root / rel), bucket, prefix + rel)

    def discard(self) -> None:
        """Remove the attempt's copy (a local workspace is left as it is). Idempotent."""
        if self.pristine is not None:
            shutil.rmtree(self.root.parent, ignore_errors=True)


NOT_COPIED = (".git", ".secrets.env")  # never in a scratch copy: history, and the local secrets file


def _not_copied(top: Path, agents: Collection[str] | None = None) -> Callable[[str, list[str]], set[str]]:
    """What the copy leaves out (programs run in it): from the workspace's top folder its
    history and secrets file; from `agents/`, every agent's folder but those of `agents` (the
    step's own, and those it may delegate to), so a program never sees another agent's
    memory or outputs. `agents` None: every agent's folder is copied."""
    agents_dir = top / "agents"

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        if here == top:
            return {n for n in names if n in NOT_COPIED}
        if agents is not None and here == agents_dir:
            return {n for n in names if n not in agents}
        return set()

    return ignore


def own_folder(folder: Path) -> Path:
    """`folder`, made 0700 where it is missing; PermissionError, naming it, where it is a
    link or another user's (so nothing of this user's is written into it)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        raise PermissionError(errno.EACCES, f"{folder} is not this user's own folder (made by uid {info.st_uid})")
    return folder


def checkout(
    uri: str, client: S3Client | None = None, *, scratch: bool = False, agents: Collection[str] | None = None
) -> WorkingCopy:
    """The folder an attempt works in: for an S3 workspace, a fresh copy of its pristine
    download in a folder of its own under /tmp; for a local one, the workspace itself, or
    with `scratch` (a sandboxed attempt) a fresh copy of it, compared with the workspace
    when the attempt completes (what changed in the four kept folders is copied back)."""
    if not uri.startswith("s3://") and not scratch:
        return WorkingCopy(root=Path(uri), uri=uri)
    pristine = local_path(uri, client)
    own_folder(ATTEMPTS)
    root = Path(tempfile.mkdtemp(prefix="attempt-", dir=ATTEMPTS)) / pristine.name
    try:
        shutil.copytree(pristine, root, symlinks=True, ignore=_not_copied(pristine, agents if scratch else None))
    except BaseException:
        shutil.rmtree(root.parent, ignore_errors=True)
        raise
    return WorkingCopy(root=root, uri=uri, pristine=pristine, client=client)


class SyncedFolders:
    """`WorkspaceFolders`: a local workspace is its own folder (a sandbox worker's attempts
    get a scratch copy of it); one in S3 is synced to /tmp."""

    def __init__(self, client: S3Client | None = None, *, scratch: bool = False):
        self._client = client
        self.scratch = scratch  # a sandbox worker's: every attempt works in a scratch copy

    def open(self, uri: str) -> Path:
        return local_path(uri, self._client)

    def checkout(self, uri: str, agents: Collection[str] | None = None) -> WorkingCopy:
        return checkout(uri, self._client, scratch=self.scratch, agents=agents)
