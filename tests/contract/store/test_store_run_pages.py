"""Runs listed page by page: `list_runs(before=RUN)` goes on after a page that ended with RUN."""

from __future__ import annotations

import pytest

from contract.store.backends import TENANT, new_run
from laneflow.adapters.store import Store
from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import RunStatus


def test_pages_after_a_run_follow_on_newest_first_with_nothing_twice_and_nothing_left_out(store: Store) -> None:
    # Given seven runs, two of them created in the same millisecond, and one of another tenant,
    made = [new_run(store, steps=1, created_at=f"2026-01-0{day}T00:00:00.000Z") for day in (1, 2, 3, 4, 5)]
    twin_a = new_run(store, steps=1, created_at="2026-01-03T00:00:00.000Z")
    twin_b = new_run(store, steps=1, created_at="2026-01-03T00:00:00.000Z")
    new_run(store, steps=1, tenant="other", created_at="2026-01-02T12:00:00.000Z")
    everything = [r.id for r in store.list_runs(TENANT, limit=100)]
    assert len(everything) == 7 and set(everything) == {r.id for r in [*made, twin_a, twin_b]}

    # When they are read three at a time, each page after the last run of the one before,
    pages: list[list[str]] = []
    before = None
    while True:
        page = [r.id for r in store.list_runs(TENANT, limit=3, before=before)]
        if not page:
            break
        pages.append(page)
        before = page[-1]

    # Then the pages are the whole list in its order, cut in threes (the twins too).
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [run_id for p in pages for run_id in p] == everything
    # A page after a run is what follows it, however it was reached.
    middle = everything.index(twin_a.id)
    assert [r.id for r in store.list_runs(TENANT, limit=100, before=twin_a.id)] == everything[middle + 1 :]


def test_a_run_created_after_a_page_was_read_does_not_shift_the_next_page(store: Store) -> None:
    runs = [new_run(store, steps=1, created_at=f"2026-02-0{day}T00:00:00.000Z") for day in (1, 2, 3, 4)]
    first = [r.id for r in store.list_runs(TENANT, limit=2)]
    assert first == [runs[3].id, runs[2].id]
    new_run(store, steps=1, created_at="2026-02-09T00:00:00.000Z")
    assert [r.id for r in store.list_runs(TENANT, limit=2, before=first[-1])] == [runs[1].id, runs[0].id]


def test_a_page_after_a_run_keeps_the_status_filter(store: Store) -> None:
    failed = [new_run(store, steps=1, status=RunStatus.failed, created_at=f"2026-03-0{day}T00:00:00.000Z") for day in (1, 3, 5)]
    done = new_run(store, steps=1, status=RunStatus.completed, created_at="2026-03-04T00:00:00.000Z")
    # the run a page ends with may be of any status: the next page starts after it in the order
    after_done = store.list_runs(TENANT, status=[RunStatus.failed], before=done.id)
    assert [r.id for r in after_done] == [failed[1].id, failed[0].id]
    assert [r.id for r in store.list_runs(TENANT, limit=1, status=[RunStatus.failed], before=failed[2].id)] == [failed[1].id]
    assert store.list_runs(TENANT, before=failed[0].id) == []


def test_a_page_after_a_run_that_is_not_there_or_is_another_tenants_is_run_not_found(store: Store) -> None:
    theirs = new_run(store, steps=1, tenant="other")
    new_run(store, steps=1)
    with pytest.raises(RunNotFound, match="run-nope"):
        store.list_runs(TENANT, before="run-nope")
    with pytest.raises(RunNotFound):
        store.list_runs(TENANT, before=theirs.id)
