"""The claim journal: pending, completed with the claim, replayed, settled."""

from __future__ import annotations

import time

import pytest

from contract.store.backends import TENANT, claim, journal_entry, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.errors import AttemptEnded, Conflict, NotFound, RunNotFound
from laneflow.domain.records import AttemptStatus, JournalStatus, ModelCall, StepChanges, StepStatus, utcnow
from laneflow.domain.workers import LocalProcess


def test_journal_begin_records_a_pending_claim_once_and_a_replay_gets_the_same_entry(store: Store) -> None:
    run = new_run(store)
    before = int(time.time())
    entry = store.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0, ttl_s=3600)
    after = int(time.time())

    assert (entry.tenant, entry.run_id, entry.op_id, entry.index) == (TENANT, run.id, "exec-1:RunStep:0:0", 0)
    assert (entry.status, entry.attempt, entry.token) == (JournalStatus.pending, None, None)
    # It expires its ttl after the call (whole seconds of the clock read around it)
    assert before + 3600 <= entry.expires_at <= after + 3600
    assert store.journal_begin(TENANT, run.id, "exec-1:RunStep:0:0", 0) == entry
    assert journal_entry(store, TENANT, run.id, "exec-1:RunStep:0:0") == entry
    assert journal_entry(store, TENANT, run.id, "exec-1:RunStep:9:0") is None
    assert store.journal_pending(TENANT) == [entry]
    assert store.journal_pending() == [entry]
    assert store.journal_pending("globex") == []


def test_journal_begin_for_a_missing_run_is_run_not_found(store: Store) -> None:
    run = new_run(store, tenant="acme")
    with pytest.raises(RunNotFound):
        store.journal_begin("globex", run.id, "op-1", 0)
    assert store.journal_pending() == []


def test_a_claim_with_an_op_id_completes_its_journal_entry_in_the_same_write(store: Store) -> None:
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-0", 0)
    attempt, _ = claim(store, run, 0, op_id="op-0")

    entry = journal_entry(store, TENANT, run.id, "op-0")
    assert entry is not None
    assert (entry.status, entry.index, entry.attempt, entry.token, entry.started_at, entry.resumed_at) == (
        JournalStatus.completed,
        0,
        1,
        attempt.token,
        attempt.started_at,
        None,
    )
    assert store.journal_pending() == []

    # Without journal_begin, the claim makes the entry itself.
    other, _ = claim(store, run, 1, op_id="op-1")
    entry = journal_entry(store, TENANT, run.id, "op-1")
    assert entry is not None
    assert (entry.status, entry.index, entry.attempt, entry.token) == (JournalStatus.completed, 1, 1, other.token)


def test_a_repeated_op_id_gets_what_the_first_claim_got_and_claims_nothing(store: Store) -> None:
    run = new_run(store)
    first, ref = claim(store, run, 0, op_id="op-0")
    # A re-delivered invocation, while the first still runs
    assert store.claim_attempt(TENANT, run.id, 0, token="another", started_at=utcnow(), op_id="op-0") == first
    # And after it ended and its step completed
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    before = snapshot(store, run)
    replay = store.claim_attempt(TENANT, run.id, 0, token="another", started_at=utcnow(), op_id="op-0")
    assert (replay.n, replay.token, replay.status) == (1, first.token, AttemptStatus.completed)
    assert snapshot(store, run) == before


def test_settling_a_pending_entry_whose_claim_never_landed_cancels_it_and_its_claim_is_refused(store: Store) -> None:
    # Given a crash between asking for a claim and getting it
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-lost", 0)
    # When reconcile settles it
    settled = store.journal_settle(TENANT, run.id, "op-lost")
    # Then it is cancelled, no longer pending, and stays as it is
    assert (settled.status, settled.attempt, settled.token) == (JournalStatus.cancelled, None, None)
    assert store.journal_pending() == []
    assert store.journal_settle(TENANT, run.id, "op-lost") == settled
    # And the late claim of that operation is refused and changes nothing
    before = snapshot(store, run)
    with pytest.raises(Conflict, match="op-lost"):
        claim(store, run, 0, op_id="op-lost")
    assert snapshot(store, run) == before


def test_settling_an_entry_whose_claim_landed_returns_it_completed(store: Store) -> None:
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-0", 0)
    attempt, _ = claim(store, run, 0, op_id="op-0")
    settled = store.journal_settle(TENANT, run.id, "op-0")
    assert (settled.status, settled.attempt, settled.token) == (JournalStatus.completed, 1, attempt.token)
    with pytest.raises(NotFound):
        store.journal_settle(TENANT, run.id, "op-unknown")


def test_a_step_claimed_many_times_keeps_every_attempt_span_and_journal_entry(store: Store) -> None:
    # Given a step failed and claimed again more times than a record keeps in itself
    run = new_run(store)
    claimed = []
    for i in range(1, 9):
        store.journal_begin(TENANT, run.id, f"op-{i}", 0)
        attempt, ref = claim(
            store,
            run,
            0,
            op_id=f"op-{i}",
            expect_status=[StepStatus.pending, StepStatus.failed],
            worker=LocalProcess(host="w", pid=i),
        )
        assert attempt.n == i
        store.heartbeat(ref, f"2026-01-01T00:00:0{i}.000Z")
        store.put_call(ref, ModelCall(id=f"turn-{i}", n=i))
        store.end_attempt(
            ref,
            AttemptStatus.failed,
            reason=f"reason {i}",
            step=StepChanges(status=StepStatus.failed),
            calls=[ModelCall(id=f"turn-{i}", n=i, ms=i)],
        )
        claimed.append((attempt, ref))
    # Then every attempt reads back, as it ended
    attempts = store.list_attempts(TENANT, run.id, 0)
    assert [(a.n, a.status, a.reason, a.worker, a.op_id, a.heartbeat_at) for a in attempts] == [
        (i, AttemptStatus.failed, f"reason {i}", LocalProcess(host="w", pid=i), f"op-{i}", f"2026-01-01T00:00:0{i}.000Z")
        for i in range(1, 9)
    ]
    assert store.list_attempts(TENANT, run.id) == attempts
    assert [store.get_attempt(TENANT, run.id, 0, i) for i in range(1, 9)] == attempts
    assert [(c.id, c.ms) for c in store.get_step(TENANT, run.id, 0, detail=True).calls] == [(f"turn-{i}", i) for i in range(1, 9)]
    for i, (attempt, ref) in enumerate(claimed, 1):
        # And every journal entry, completed with its attempt
        entry = journal_entry(store, TENANT, run.id, f"op-{i}")
        assert entry is not None
        assert (entry.status, entry.index, entry.attempt, entry.token, entry.started_at) == (
            JournalStatus.completed,
            0,
            i,
            attempt.token,
            attempt.started_at,
        )
        # And a re-delivered invocation of any of them gets what it got and claims nothing
        assert store.journal_begin(TENANT, run.id, f"op-{i}", 0) == entry
        assert store.journal_settle(TENANT, run.id, f"op-{i}") == entry
        replay = store.claim_attempt(
            TENANT, run.id, 0, token="again", started_at=utcnow(), op_id=f"op-{i}", expect_status=[StepStatus.failed]
        )
        assert replay == attempts[i - 1]
        # And its late writes never land
        with pytest.raises(AttemptEnded):
            store.heartbeat(ref, utcnow())
    assert store.list_attempts(TENANT, run.id, 0) == attempts
    assert store.journal_pending() == []


def test_an_entry_left_pending_while_another_claims_attempt_runs_stays_pending_after_it_ends(store: Store) -> None:
    # Given a claim whose attempt runs, and a second invocation journaled while it does (refused)
    run = new_run(store)
    store.journal_begin(TENANT, run.id, "op-a", 0)
    _, ref = claim(store, run, 0, op_id="op-a")
    store.journal_begin(TENANT, run.id, "op-b", 0)
    with pytest.raises(Conflict):
        claim(store, run, 0, op_id="op-b", expect_status=[StepStatus.pending, StepStatus.running])
    assert [e.op_id for e in store.journal_pending(TENANT)] == ["op-b"]
    # When the attempt ends
    store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    # Then the entry is still pending, until it is settled
    assert store.running_attempts(TENANT) == []
    assert [e.op_id for e in store.journal_pending(TENANT)] == ["op-b"]
    assert store.journal_settle(TENANT, run.id, "op-b").status == JournalStatus.cancelled
    assert store.journal_pending() == []
    settled = journal_entry(store, TENANT, run.id, "op-a")
    assert settled is not None and settled.status == JournalStatus.completed
