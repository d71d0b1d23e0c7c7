"""Handoff blocks and the warm gate's rendezvous."""

from __future__ import annotations

import threading
import time

from contract.store.backends import TENANT, new_run
from laneflow.adapters.store import Store


def test_a_handoff_is_kept_per_key_and_replaced_by_a_later_put(store: Store):
    run = new_run(store)
    assert store.get_handoff(TENANT, run.id, "g1c0:results") is None
    store.put_handoff(TENANT, run.id, "g1c0:results", "first")
    store.put_handoff(TENANT, run.id, "g1c0:results", "second")
    store.put_handoff(TENANT, run.id, "g1c0:data", "data")
    assert store.get_handoff(TENANT, run.id, "g1c0:results") == "second"
    assert store.get_handoff(TENANT, run.id, "g1c0:data") == "data"
    assert store.get_handoff("other-tenant", run.id, "g1c0:results") is None


def test_the_gate_rendezvous_hands_every_token_back_exactly_once_under_a_race(store: Store):
    """Siblings arrive while the lead opens: each token is either kept and handed to the
    lead, or its sibling is told the gate is open. None is lost, none is handed back twice."""
    for trial in range(5):
        _race_the_rendezvous(store, trial)


def _race_the_rendezvous(store: Store, trial: int) -> None:
    run = new_run(store)
    key = f"g0c0:lane-{trial}"
    told_open: list[str] = []
    handed: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(21)

    def sibling(n: int) -> None:
        barrier.wait()
        token = f"tok-{n}"
        if store.gate_wait(TENANT, run.id, key, token) is not None:
            with lock:
                told_open.append(token)

    def lead() -> None:
        barrier.wait()
        time.sleep(0.001 * trial)
        tokens = store.gate_open(TENANT, run.id, key)
        with lock:
            handed.extend(w.token for w in tokens)

    threads = [threading.Thread(target=sibling, args=(n,)) for n in range(20)] + [threading.Thread(target=lead)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(told_open + handed) == sorted(f"tok-{n}" for n in range(20))
    assert store.gate_open(TENANT, run.id, key) == []
