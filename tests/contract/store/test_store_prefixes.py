"""The prefix registry (the prompt cache across runs): claims, the writer's first event,
reads, releases and waiters, on every store, under races."""

from __future__ import annotations

import threading

from contract.store.backends import TENANT
from laneflow.adapters.store import Store
from laneflow.domain.prefixes import TTL_S, WARM_MARGIN_S, WRITER_WAIT_S, PrefixWaiter, PrefixWriter

MODEL = "claude-sonnet-4-5"
T0 = 1_800_000_000.0


def writer(run: str, index: int = 0, n: int = 1, at: float = T0) -> PrefixWriter:
    return PrefixWriter(run_id=run, index=index, n=n, claimed_at=at)


def _race(store: Store, key: str) -> dict[str, str]:
    barrier = threading.Barrier(10)
    states: dict[str, str] = {}
    lock = threading.Lock()

    def lead(n: int) -> None:
        barrier.wait()
        found = store.prefix_claim(TENANT, key, model=MODEL, writer=writer(f"run-{n}"), now=T0)
        with lock:
            states[f"run-{n}"] = found.state

    threads = [threading.Thread(target=lead, args=(n,)) for n in range(10)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return states


def test_two_leads_of_two_runs_racing_for_one_prefix_make_exactly_one_writer(store: Store) -> None:
    for trial in range(3):
        key = f"race-{trial}"
        states = _race(store, key)
        writers = [run for run, state in states.items() if state == "write"]
        assert len(writers) == 1, states
        assert sorted(states.values()).count("wait") == 9
        record = store.get_prefix(TENANT, key)
        assert record is not None and record.writer is not None and record.writer.run_id == writers[0]
        assert key in {r.key for _, r in store.list_writing_prefixes(TENANT)}


def test_a_writers_first_event_warms_the_prefix_and_hands_back_each_waiter_once(store: Store) -> None:
    w = writer("run-a")
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=w, now=T0).state == "write"
    kept = store.prefix_wait(TENANT, "k", PrefixWaiter(token="tok-b", run_id="run-b", index=0, since=T0 + 1), now=T0 + 1)
    assert kept is not None and kept.writer is not None and kept.writer.run_id == "run-a"
    # The same token again is kept once.
    store.prefix_wait(TENANT, "k", PrefixWaiter(token="tok-b", run_id="run-b", index=0, since=T0 + 1), now=T0 + 1)
    handed = store.prefix_began(TENANT, "k", model=MODEL, run_id="run-a", writer=w, at=T0 + 2, ttl="5m")
    assert [h.token for h in handed] == ["tok-b"]
    record = store.get_prefix(TENANT, "k")
    assert record is not None and record.writer is None and record.waiters == [] and record.warmed_by == "run-a"
    assert record.written_at == T0 + 2 and record.warm(T0 + 2 + TTL_S["5m"] - WARM_MARGIN_S - 1)
    assert not record.warm(T0 + 2 + TTL_S["5m"] - WARM_MARGIN_S + 1)
    # Now warm: a later lead claims nothing, a later waiter is not kept.
    later = store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-c", at=T0 + 10), now=T0 + 10)
    assert later.state == "warm" and later.record.warmed_by == "run-a"
    assert store.prefix_wait(TENANT, "k", PrefixWaiter(token="t", run_id="run-d", index=0, since=T0), now=T0 + 10) is None
    assert all(r.key != "k" for _, r in store.list_writing_prefixes())
    # A second opening hands nothing back.
    assert store.prefix_began(TENANT, "k", model=MODEL, run_id="run-a", writer=w, at=T0 + 3, ttl="5m") == []


def test_a_writer_that_ends_without_beginning_releases_its_claim_and_its_waiters(store: Store) -> None:
    w = writer("run-a")
    store.prefix_claim(TENANT, "k", model=MODEL, writer=w, now=T0)
    store.prefix_wait(TENANT, "k", PrefixWaiter(token="tok-b", run_id="run-b", index=3, since=T0), now=T0 + 1)
    # Another attempt's release changes nothing.
    assert store.prefix_release(TENANT, "k", writer("run-x")) == []
    handed = store.prefix_release(TENANT, "k", w)
    assert [(h.token, h.index) for h in handed] == [("tok-b", 3)]
    record = store.get_prefix(TENANT, "k")
    assert record is not None and record.writer is None and not record.warm(T0 + 1)
    assert all(r.key != "k" for _, r in store.list_writing_prefixes(TENANT))
    # The next lead writes it.
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-b"), now=T0 + 2).state == "write"


def test_a_writer_that_never_begins_is_taken_over_after_the_cap(store: Store) -> None:
    store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-a"), now=T0)
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-b"), now=T0 + WRITER_WAIT_S - 1).state == "wait"
    taken = store.prefix_claim(
        TENANT, "k", model=MODEL, writer=writer("run-b", at=T0 + WRITER_WAIT_S + 1), now=T0 + WRITER_WAIT_S + 1
    )
    assert taken.state == "write" and taken.record.writer is not None and taken.record.writer.run_id == "run-b"
    # Past the cap nobody is kept waiting on the stale writer either.
    store.prefix_release(TENANT, "k", writer("run-b"))
    store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-c"), now=T0)
    late = PrefixWaiter(token="t", run_id="run-d", index=0, since=T0 + WRITER_WAIT_S + 5)
    assert store.prefix_wait(TENANT, "k", late, now=T0 + WRITER_WAIT_S + 5) is None


def test_reads_keep_a_prefix_warm_and_the_registry_is_per_tenant(store: Store) -> None:
    store.prefix_read(TENANT, "k", model=MODEL, run_id="run-a", at=T0)
    record = store.get_prefix(TENANT, "k")
    assert record is not None and record.read_at == T0 and record.warm(T0 + 200)
    assert store.get_prefix("other-tenant", "k") is None
    assert store.prefix_claim("other-tenant", "k", model=MODEL, writer=writer("run-z"), now=T0).state == "write"
    # A read within a minute of the last is not written again; a later one is.
    store.prefix_read(TENANT, "k", model=MODEL, run_id="run-a", at=T0 + 30)
    assert store.get_prefix(TENANT, "k").read_at == T0  # type: ignore[union-attr]
    store.prefix_read(TENANT, "k", model=MODEL, run_id="run-a", at=T0 + 250)
    assert store.get_prefix(TENANT, "k").read_at == T0 + 250  # type: ignore[union-attr]
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-b"), now=T0 + 500).state == "warm"


def test_a_one_hour_write_stays_warm_past_five_minutes(store: Store) -> None:
    w = writer("run-a")
    store.prefix_claim(TENANT, "k", model=MODEL, writer=w, now=T0)
    store.prefix_began(TENANT, "k", model=MODEL, run_id="run-a", writer=w, at=T0, ttl="1h")
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-b"), now=T0 + 15 * 60).state == "warm"
    assert store.prefix_claim(TENANT, "k", model=MODEL, writer=writer("run-b"), now=T0 + 3600).state == "write"
