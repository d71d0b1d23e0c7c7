"""How both stores write values: JSON text, costs, worker references."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_jsonable_python

from laneflow.domain import workers
from laneflow.domain.workers import WorkerRef

COST_DECIMALS = 6  # costs are rounded whenever they are stored, so sums show no binary drift


def dumps(value: Any) -> str:
    """A JSON field's stored text: compact, non-ASCII kept, pydantic values as JSON."""
    return json.dumps(value, default=to_jsonable_python, ensure_ascii=False, separators=(",", ":"))


def cost(value: Any) -> float:
    return round(float(value), COST_DECIMALS)


def worker_text(worker: WorkerRef | None) -> str | None:
    """A worker reference as stored (the text it was kept as before references were models)."""
    return None if worker is None else workers.dumps(worker)
