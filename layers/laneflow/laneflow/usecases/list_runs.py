"""Listing a tenant's runs, each with its cost so far: the newest, or a page of them that a
person filters by status and searches.

A run's stored cost is settled when a group ends, so a run still running would list as $0
through its first group. A running run's listed cost is therefore what its steps have spent
so far, read from its group outline (one row per group, never its steps whole); an ended or
parked run's settled cost is already that."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import Run, RunStatus
from laneflow.ports import Services

# What a person filters by: a run's status, or "stopped" for a run a person stopped (it ended
# failed with `stop_requested`; a run whose stop came after it completed stays completed).
STOPPED = "stopped"
SHOWN_STATUSES = (*(s.value for s in RunStatus), STOPPED)

# A search reads at most this many runs per page before it answers with what it found and
# where to go on from: a page of a rare match is bounded work (a few hundred run heads).
SEARCHED_AT_MOST = 500
BATCH = 100


def runs_with_live_cost(svc: Services, tenant: str, *, limit: int = 50) -> list[Run]:
    """The tenant's newest runs; a running one's `cost_usd` is what it has spent so far."""
    runs = svc.store.list_runs(tenant, limit=limit)
    return [_with_live_cost(svc, run) for run in runs]


def shown_status(run: Run) -> str:
    """The run's status as a person reads it: "stopped" for a run a person stopped."""
    return STOPPED if run.stop_requested and run.status == RunStatus.failed else run.status.value


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    next: str | None  # what to pass as `before` for the page after; None: no older run
    searched: int  # how many runs were read to make it


def page_of_runs(
    svc: Services,
    tenant: str,
    *,
    limit: int = 50,
    before: str | None = None,
    status: Collection[str] = (),
    text: str = "",
) -> RunPage:
    """A page of the tenant's runs, newest first: at most `limit`, after run `before`, of the
    shown statuses `status` (any when empty), whose id, workspace, flow, status or error holds
    every word of `text` (case-blind). A page with a search or a filter may come back short
    after SEARCHED_AT_MOST runs were read: its `next` then says where to go on."""
    wanted = _stored_statuses(status)
    keep = _matcher(status, text)
    found: list[Run] = []
    searched, cursor, more = 0, before, True
    while more and len(found) <= limit and searched < SEARCHED_AT_MOST:
        # Unfiltered, one more than a page says whether there is a next; filtered, in batches.
        ask = limit + 1 - len(found) if keep is None else min(BATCH, SEARCHED_AT_MOST - searched)
        batch = svc.store.list_runs(tenant, limit=ask, status=wanted, before=cursor)
        more = len(batch) == ask
        for run in batch:
            searched += 1
            cursor = run.id
            if keep is None or keep(run):
                found.append(run)
                if len(found) > limit:
                    break
    after: str | None = cursor if more else None
    if len(found) > limit:
        found, after = found[:limit], found[limit - 1].id
    return RunPage([_with_live_cost(svc, run) for run in found], after, searched)


def _stored_statuses(shown: Collection[str]) -> list[RunStatus] | None:
    if not shown:
        return None
    return sorted({RunStatus.failed if s == STOPPED else RunStatus(s) for s in shown})


def _matcher(shown: Collection[str], text: str) -> Callable[[Run], bool] | None:
    """What a stored run must also be to be listed, or None when every run the store lists
    is (the store filters by stored status; failed and stopped share one)."""
    words = text.casefold().split()
    split = RunStatus.failed.value in shown or STOPPED in shown
    if not words and not split:
        return None

    def keep(run: Run) -> bool:
        status = shown_status(run)
        if split and status not in shown:
            return False
        said = "\n".join((run.id, run.workspace, run.flow, f"{run.workspace}/{run.flow}", status, run.error or ""))
        return all(word in said.casefold() for word in words)

    return keep


def _with_live_cost(svc: Services, run: Run) -> Run:
    if run.status != RunStatus.running:
        return run
    try:
        spent = sum(g.cost_usd for g in svc.store.get_group_outline(run.tenant, run.id))
    except RunNotFound:  # removed between the list and this read
        return run
    return run.model_copy(update={"cost_usd": round(max(run.cost_usd, spent), 6)})
