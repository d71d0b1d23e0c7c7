"""Handoff blocks and the warm gate's rendezvous."""

from __future__ import annotations

import threading
import time

from contract.store.backends import TENANT, new_run
from laneflow.adapters.store import Store


def test_a_handoff_is_kept_per_key_and_replaced_by_a_later_put(store: Store) -> None:
    run = new_run(store)
    assert store.get_handoff(TENANT, run.id, "g1c0:results") is None
    store.put_handoff(TENANT, run.id, "g1c0:results", "first")
    store.put_handoff(TENANT, run.id, "g1c0:results", "second")
    store.put_handoff(TENANT, run.id, "g1c0:data", "data")
    assert store.get_handoff(TENANT, run.id, "g1c0:results") == "second"
    assert store.get_handoff(TENANT, run.id, "g1c0:data") == "data"
    assert store.get_handoff("other-tenant", run.id, "g1c0:results") is None


def test_the_gate_rendezvous_hands_every_token_back_exactly_once_under_a_race(store: Store) -> None:
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


def test_the_reserve_waits_past_the_reply_and_is_handed_back_only_when_the_lead_ends(store: Store) -> None:
    """A sibling waiting for the lead's reply is released when it begins; the reserve (which
    holds the lead's pool slot) only when the lead ends. Each waiter comes back with its step."""
    run = new_run(store)
    key = "g0c0:lane@stub"
    assert store.gate_wait(TENANT, run.id, key, "tok-1", index=1) is None
    assert store.gate_wait(TENANT, run.id, key, "tok-3", index=3, until_lead_ends=True) is None
    reply = store.gate_open(TENANT, run.id, key)
    assert [(w.token, w.index, w.until_lead_ends) for w in reply] == [("tok-1", 1, False)]
    assert store.gate_open(TENANT, run.id, key) == []  # the reply's opening happened already
    # After the reply: a sibling passes at once, a reserve still waits.
    assert store.gate_wait(TENANT, run.id, key, "tok-2", index=2) is not None
    assert store.gate_wait(TENANT, run.id, key, "tok-4", index=4, until_lead_ends=True) is None
    ended = store.gate_open(TENANT, run.id, key, lead_ended=True)
    assert sorted((w.token, w.index, w.until_lead_ends) for w in ended) == [("tok-3", 3, True), ("tok-4", 4, True)]
    assert store.gate_open(TENANT, run.id, key, lead_ended=True) == []
    assert store.gate_open(TENANT, run.id, key) == []
    # After the lead's end everyone passes.
    assert store.gate_wait(TENANT, run.id, key, "tok-5", index=5, until_lead_ends=True) is not None
    assert store.gate_wait(TENANT, run.id, key, "tok-6", index=6) is not None


def test_a_lead_that_ends_without_a_reply_hands_back_every_waiter_at_once(store: Store) -> None:
    run = new_run(store)
    key = "g0c0:lane@stub"
    assert store.gate_wait(TENANT, run.id, key, "tok-1", index=1) is None
    assert store.gate_wait(TENANT, run.id, key, "tok-2", index=2, until_lead_ends=True) is None
    ended = store.gate_open(TENANT, run.id, key, lead_ended=True)
    assert sorted(w.token for w in ended) == ["tok-1", "tok-2"]
    assert store.gate_wait(TENANT, run.id, key, "tok-3", index=3) is not None


def test_the_lead_s_note_reaches_every_later_pass_and_the_first_note_is_kept(store: Store) -> None:
    run = new_run(store)
    key = "g0c0:lane@claude"
    early = store.gate_wait(TENANT, run.id, key, "tok-1", index=1)
    assert early is None
    assert [w.token for w in store.gate_open(TENANT, run.id, key, note="below the minimum")] == ["tok-1"]
    store.gate_open(TENANT, run.id, key, note="a second note")
    passed = store.gate_wait(TENANT, run.id, key, "tok-2", index=2)
    assert passed is not None and passed.note == "below the minimum"
    plain = new_run(store)
    store.gate_open(TENANT, plain.id, key)
    passed = store.gate_wait(TENANT, plain.id, key, "tok-3")
    assert passed is not None and passed.note is None


def test_reserves_and_siblings_racing_both_openings_are_each_handed_back_exactly_once(store: Store) -> None:
    """Siblings and reserves arrive while the lead's reply begins and then it ends: every
    token is handed back once (or its sibling told to go), and no reserve goes before the end."""
    for trial in range(3):
        _race_both_openings(store, trial)


def _race_both_openings(store: Store, trial: int) -> None:
    run = new_run(store)
    key = f"g0c0:lane-{trial}"
    passed: dict[str, bool] = {}  # token -> the lead's end had begun when it was told to go
    handed_at_reply: list[str] = []
    handed_at_end: list[str] = []
    ended = threading.Event()
    lock = threading.Lock()
    barrier = threading.Barrier(17)

    def sibling(n: int) -> None:
        barrier.wait()
        reserve = n % 4 == 0
        if store.gate_wait(TENANT, run.id, key, f"tok-{n}", index=n, until_lead_ends=reserve) is not None:
            with lock:
                passed[f"tok-{n}"] = ended.is_set() or not reserve

    def lead() -> None:
        barrier.wait()
        time.sleep(0.001 * trial)
        handed_at_reply.extend(w.token for w in store.gate_open(TENANT, run.id, key))
        time.sleep(0.002)
        ended.set()
        handed_at_end.extend(w.token for w in store.gate_open(TENANT, run.id, key, lead_ended=True))

    threads = [threading.Thread(target=sibling, args=(n,)) for n in range(16)] + [threading.Thread(target=lead)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(list(passed) + handed_at_reply + handed_at_end) == sorted(f"tok-{n}" for n in range(16))
    assert not any(int(t.split("-")[1]) % 4 == 0 for t in handed_at_reply), "a reserve went with the reply"
    assert all(passed.values()), "a reserve was told to go before the lead ended"


def test_a_claimed_gate_has_one_lead_however_many_race_for_it_and_opens_for_the_rest(store: Store) -> None:
    """`gate_claim`: of callers racing for a new gate exactly one is its lead; the others are
    told to wait until the lead opens it, then that it is open; a gate of another key or run
    is its own."""
    run = new_run(store)
    other = new_run(store)
    answers: list[str] = []
    lock = threading.Lock()

    def claim() -> None:
        answer = store.gate_claim(TENANT, run.id, "delegate:researcher")
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == ["lead"] + ["wait"] * 7
    assert store.gate_claim(TENANT, run.id, "delegate:researcher") == "wait"
    assert store.gate_claim(TENANT, run.id, "delegate:clerk") == "lead"  # another key
    assert store.gate_claim(TENANT, other.id, "delegate:researcher") == "lead"  # another run
    assert store.gate_open(TENANT, run.id, "delegate:researcher") == []  # nobody was kept
    assert store.gate_claim(TENANT, run.id, "delegate:researcher") == "open"
    assert store.gate_claim(TENANT, run.id, "delegate:clerk") == "wait"
    store.gate_open(TENANT, run.id, "delegate:clerk", lead_ended=True)
    assert store.gate_claim(TENANT, run.id, "delegate:clerk") == "open"
