"""What is live: running attempts and active runs, of one tenant or all."""

from __future__ import annotations

from contract.store.backends import claim, new_run
from laneflow.adapters.store import Store
from laneflow.domain.records import AttemptStatus, RunChanges, RunStatus, StepChanges, StepStatus, utcnow


def test_running_attempts_are_the_attempts_still_running_of_one_tenant_or_all(store: Store) -> None:
    acme, globex = new_run(store, tenant="acme"), new_run(store, tenant="globex")
    a0, _ = claim(store, acme, 0)
    _, a1_ref = claim(store, acme, 1)
    b0, b0_ref = claim(store, globex, 0)
    store.end_attempt(a1_ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed))
    store.heartbeat(b0_ref, "2026-08-08T00:00:00.000Z")

    assert store.running_attempts("acme") == [("acme", a0)]
    assert store.running_attempts("initech") == []
    everyone = store.running_attempts()
    assert sorted((t, a.run_id, a.index, a.n) for t, a in everyone) == [("acme", acme.id, 0, 1), ("globex", globex.id, 0, 1)]
    assert dict(everyone)["globex"] == b0.model_copy(update={"heartbeat_at": "2026-08-08T00:00:00.000Z"})

    store.end_attempt(b0_ref, AttemptStatus.failed, reason="model error", step=StepChanges(status=StepStatus.failed))
    assert store.running_attempts() == [("acme", a0)]


def test_active_runs_are_the_queued_running_and_parked_runs_and_a_run_leaves_when_it_ends(store: Store) -> None:
    queued = new_run(store, tenant="acme", created_at="2026-01-01T00:00:00.000Z")
    running = new_run(store, tenant="acme", status=RunStatus.running, created_at="2026-01-02T00:00:00.000Z")
    parked = new_run(store, tenant="globex", status=RunStatus.awaiting_approval, created_at="2026-01-03T00:00:00.000Z")
    done = new_run(store, tenant="acme", status=RunStatus.completed, created_at="2026-01-04T00:00:00.000Z")
    new_run(store, tenant="acme", status=RunStatus.failed, created_at="2026-01-05T00:00:00.000Z")

    assert [r.id for r in store.active_runs("acme")] == [queued.id, running.id]
    assert [r.id for r in store.active_runs()] == [queued.id, running.id, parked.id]
    assert store.active_runs("acme")[0] == store.get_run("acme", queued.id, steps=False)
    assert store.active_runs("initech") == []

    # When one ends and an ended one is driven again (a re-drive)
    store.update_run("acme", running.id, RunChanges(status=RunStatus.failed, finished_at=utcnow()))
    store.update_run("acme", done.id, RunChanges(status=RunStatus.running))
    # Then the active runs follow
    assert [r.id for r in store.active_runs("acme")] == [queued.id, done.id]
    # And a write that does not change the status does not change what is active
    store.update_run("acme", queued.id, RunChanges(error="slow"), add_drives=1)
    assert [r.id for r in store.active_runs("acme")] == [queued.id, done.id]
