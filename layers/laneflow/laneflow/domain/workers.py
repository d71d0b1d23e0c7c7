"""Worker references as they are stored on attempts and runs (JSON text)."""

from __future__ import annotations

import json
from typing import Any


def dumps(worker: dict[str, Any]) -> str:
    return json.dumps(worker, sort_keys=True)



def loads(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None



def same_worker(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two worker references name one worker (the same process, Lambda request,
    execution or task)."""
    keys = ("kind", "host", "pid", "started", "request_id", "execution", "task")
    return all(a.get(k) == b.get(k) for k in keys)
