"""Listing a tenant's runs, each with its cost so far.

A run's stored cost is settled when a group ends, so a run still running would list as $0
through its first group. A running run's listed cost is therefore what its steps have spent
so far, read from its group outline (one row per group, never its steps whole); an ended or
parked run's settled cost is already that."""

from __future__ import annotations

from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import Run, RunStatus
from laneflow.ports import Services


def runs_with_live_cost(svc: Services, tenant: str, *, limit: int = 50) -> list[Run]:
    """The tenant's newest runs; a running one's `cost_usd` is what it has spent so far."""
    runs = svc.store.list_runs(tenant, limit=limit)
    return [_with_live_cost(svc, run) for run in runs]


def _with_live_cost(svc: Services, run: Run) -> Run:
    if run.status != RunStatus.running:
        return run
    try:
        spent = sum(g.cost_usd for g in svc.store.get_group_outline(run.tenant, run.id))
    except RunNotFound:  # removed between the list and this read
        return run
    return run.model_copy(update={"cost_usd": round(max(run.cost_usd, spent), 6)})
