"""A step's cached prefix and, when its first call writes one, its `cache_break`: why it did
not read the prefix an earlier step of its agent wrote (in this run, else in the flow's
previous run in the same tenant and workspace). The rule is `domain.lanes_report.cache_break`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from laneflow.domain.cache import prefix_tokens, tools_digest
from laneflow.domain.lanes_report import cache_break, earlier_writers
from laneflow.domain.records import PromptLayer, Run, Step
from laneflow.ports import Services, StepJob

log = logging.getLogger("laneflow.step")

PREVIOUS_RUNS_LOOKED_AT = 50



def step_prefix(svc: Services, job: StepJob) -> dict[str, Any]:
    """{"tokens": the prefix's size (tools, then the stable system), "tools": their digest}."""
    defs = svc.tool_definitions(job) if svc.tool_definitions else []
    return {"tokens": prefix_tokens(job.system_stable, defs), "tools": tools_digest(str(d.get("name", "")) for d in defs)}



def previous_run(svc: Services, run: Run) -> tuple[str, list[Step]] | None:
    """The flow's run before this one in the same tenant and workspace, with its steps."""
    for other in svc.store.list_runs(run.tenant, limit=PREVIOUS_RUNS_LOOKED_AT):
        if other.id != run.id and other.workspace == run.workspace and other.flow == run.flow and other.created_at < run.created_at:
            full = svc.store.get_run(run.tenant, other.id, detail=True)
            return full.id, full.steps
    return None



def find_cache_break(
    svc: Services, tenant: str, run_id: str, index: int, *, model: str, layers: Sequence[PromptLayer], prefix: dict[str, Any]
) -> dict[str, str] | None:
    """The step's `cache_break`, or None; a failure to read is logged, never the step's."""
    try:
        run = svc.store.get_run(tenant, run_id, detail=True)
        step = run.step(index)
        earlier = earlier_writers(step, (run.id, run.steps), None)
        if not earlier:
            earlier = earlier_writers(step, (run.id, []), previous_run(svc, run))
        return cache_break(model=model, layers=layers, prefix=prefix, earlier=earlier)
    except Exception:  # noqa: BLE001 - the record is a nicety; the step goes on
        log.warning("step %s of %s: its cache_break could not be worked out", index, run_id, exc_info=True)
        return None
