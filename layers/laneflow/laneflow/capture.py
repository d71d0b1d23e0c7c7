"""Tool-call captures kept beside the run: a folder beside the store locally
(`FolderCaptures`), the bucket in the cloud (`S3Captures`), each under its tenant first.

A capture holds a tool call's input and output, masked; at most `STEP_CAPTURE_LIMIT`
characters per step, after which calls keep names, sizes and times only.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

from .tenants import check_tenant

STEP_CAPTURE_LIMIT = 4_000_000


class CaptureSink(Protocol):
    def put(self, tenant: str, run_id: str, key: str, record: dict[str, Any]) -> str:
        """Store one capture; returns its reference (relative key)."""


class FolderCaptures:
    """Captures as JSON files under `<root>/<tenant>/<run_id>/<key>.json`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._lock = threading.Lock()

    def put(self, tenant: str, run_id: str, key: str, record: dict[str, Any]) -> str:
        rel = f"{check_tenant(tenant)}/{run_id}/{key}.json"
        path = self.root / rel
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
        return rel

    def get(self, ref: str) -> dict[str, Any]:
        return json.loads((self.root / ref).read_text(encoding="utf-8"))


class S3Captures:
    """Captures as JSON objects at `s3://<bucket>/<prefix>/<tenant>/<run_id>/<key>.json`.

    The reference returned (and kept on the tool event) is the part after the prefix, as
    with `FolderCaptures`. The client is made on first use, once (boto3's usual settings;
    `region` overrides the region)."""

    def __init__(self, bucket: str, prefix: str = "captures", *, region: str | None = None, client: Any | None = None):
        self.bucket, self.prefix, self.region = bucket, prefix.strip("/"), region
        self._client = client
        self._lock = threading.Lock()

    def _s3(self) -> Any:
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
        body = json.dumps(record, ensure_ascii=False).encode("utf-8")
        self._s3().put_object(Bucket=self.bucket, Key=self.key(rel), Body=body, ContentType="application/json")
        return rel

    def get(self, ref: str) -> dict[str, Any]:
        return json.loads(self._s3().get_object(Bucket=self.bucket, Key=self.key(ref))["Body"].read().decode("utf-8"))


class Redactor:
    """Replaces every secret value of 8 characters or more by its name, longest value first."""

    MIN_LEN = 8

    def __init__(self, secrets: dict[str, str] | None = None):
        pairs = [(name, value) for name, value in (secrets or {}).items() if value and len(value) >= self.MIN_LEN]
        self._pairs = sorted(pairs, key=lambda p: len(p[1]), reverse=True)

    def __call__(self, text: str) -> str:
        for name, value in self._pairs:
            text = text.replace(value, f"[{name}]")
        return text
