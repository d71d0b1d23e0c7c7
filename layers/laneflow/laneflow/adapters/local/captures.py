"""Tool-call captures on this machine: JSON files in a folder beside the store."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from laneflow.domain.redaction import Redactor
from laneflow.domain.tenants import check_tenant


class FolderCaptures:
    """Captures as JSON files under `<root>/<tenant>/<run_id>/<key>.json`, masked by
    `redactor` (the store's, so a capture is masked like every record) as they are written."""

    def __init__(self, root: str | Path, redactor: Redactor | None = None):
        self.root = Path(root)
        self.redactor = redactor
        self._lock = threading.Lock()

    def put(self, tenant: str, run_id: str, key: str, record: dict[str, Any]) -> str:
        rel = f"{check_tenant(tenant)}/{run_id}/{key}.json"
        path = self.root / rel
        if self.redactor is not None:
            record = self.redactor.value(record)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
        return rel

    def get(self, ref: str) -> dict[str, Any]:
        record: dict[str, Any] = json.loads((self.root / ref).read_text(encoding="utf-8"))
        return record
