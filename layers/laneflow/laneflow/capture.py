"""Tool-call captures kept beside the run (a folder locally, S3 in the cloud: DESIGN 9).

A capture holds a tool call's input and output, masked; at most `STEP_CAPTURE_LIMIT`
characters per step, after which calls keep names, sizes and times only.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

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
        rel = f"{tenant}/{run_id}/{key}.json"
        path = self.root / rel
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
        return rel

    def get(self, ref: str) -> dict[str, Any]:
        return json.loads((self.root / ref).read_text(encoding="utf-8"))


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
