"""A step's cached prefix and, when its first call writes one, its `cache_break`: why it did
not read the prefix an earlier step of its agent wrote (in this run, else in the flow's
previous run in the same tenant and workspace). The rule is `domain.lanes_report.cache_break`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from laneflow.domain.cache import prefix_tokens, tools_digest
from laneflow.domain.lanes_report import cache_break, earlier_writers, started_before, writes_prefix
from laneflow.domain.outline import StepFilter
from laneflow.domain.prefixes import prefix_key
from laneflow.domain.records import PromptLayer, Run, Step
from laneflow.domain.workspace import Agent
from laneflow.ports import Services, StepJob

log = logging.getLogger("laneflow.step")

PREVIOUS_RUNS_LOOKED_AT = 50


def step_prefix(svc: Services, job: StepJob) -> dict[str, Any]:
    """{"tokens": the prefix's size (tools, then the stable system), "tools": their digest}."""
    defs = svc.tool_definitions(job) if svc.tool_definitions else []
    return {"tokens": prefix_tokens(job.system_stable, defs), "tools": tools_digest(str(d.get("name", "")) for d in defs)}


def job_prefix_key(job: StepJob) -> str:
    """The prefix registry's key of a job's cached prefix (laneflow.domain.prefixes): its
    model, its tools by name (MCP servers and APIs by theirs: their definitions are described
    in the stable layers too) and its stable system text. The same for the step that writes
    it, the steps that wait for it and the estimate that looks it up."""
    return _key(job.model, job.system_stable, job.tools, (m.name for m in job.mcp), (a.name for a in job.apis))


def agent_prefix_key(model: str, system_stable: str, agent: Agent) -> str:
    """`job_prefix_key` of a step of `agent` on `model` whose stable system is `system_stable`,
    before its job is made (a job takes these from the agent as they are here)."""
    return _key(model, system_stable, agent.settings.tools, (m.name for m in agent.mcp), (a.name for a in agent.apis))


def _key(model: str, stable: str, tools: Iterable[str], mcp: Iterable[str], apis: Iterable[str]) -> str:
    return prefix_key(model, stable, (*tools, *(f"mcp:{m}" for m in mcp), *(f"api:{a}" for a in apis)))


def previous_run(svc: Services, run: Run) -> tuple[str, list[Step]] | None:
    """The flow's run before this one in the same tenant and workspace, with its steps."""
    for other in svc.store.list_runs(run.tenant, limit=PREVIOUS_RUNS_LOOKED_AT):
        if (
            other.id != run.id
            and other.workspace == run.workspace
            and other.flow == run.flow
            and other.created_at < run.created_at
        ):
            full = svc.store.get_run(run.tenant, other.id, detail=True)
            return full.id, full.steps
    return None


def nearest_writers(svc: Services, tenant: str, run_id: str, step: Step, model: str) -> list[tuple[str, Step]]:
    """This run's steps of `step`'s agent that wrote (or, running, are writing) its prefix
    before it, nearest first, as far as `cache_break` looks: up to the nearest of `model`.
    Only the agent's steps that had started by then are read, and in full only one by one
    from the nearest: a whole run read in full for every step that wrote made a fan-out
    without the gate (up to `parallel` writers at once) cost its size squared."""
    if step.started_at is None or step.agent is None:
        return []
    started = svc.store.get_steps(tenant, run_id, messages=False, where=StepFilter(agent=step.agent, started_by=step.started_at))
    found: list[tuple[str, Step]] = []
    for light in sorted(started, key=lambda s: (s.started_at or "", s.index), reverse=True):
        if not started_before(light, step):
            continue
        full = svc.store.get_step(tenant, run_id, light.index, detail=True)
        if not writes_prefix(full):
            continue  # it read the prefix, or sent none
        found.append((run_id, full))
        if full.model == model:
            break  # what cache_break compares with; nearer ones of other models come first
    return found


def find_cache_break(
    svc: Services, tenant: str, run_id: str, index: int, *, model: str, layers: Sequence[PromptLayer], prefix: dict[str, Any]
) -> dict[str, str] | None:
    """The step's `cache_break`, or None; a failure to read is logged, never the step's."""
    try:
        step = svc.store.get_step(tenant, run_id, index)
        earlier = nearest_writers(svc, tenant, run_id, step, model)
        if not earlier:
            run = svc.store.get_run(tenant, run_id, steps=False, input=False)
            earlier = earlier_writers(step, (run_id, []), previous_run(svc, run))
        return cache_break(model=model, layers=layers, prefix=prefix, earlier=earlier)
    except Exception:  # the record is a nicety; the step goes on
        log.warning("step %s of %s: its cache_break could not be worked out", index, run_id, exc_info=True)
        return None
