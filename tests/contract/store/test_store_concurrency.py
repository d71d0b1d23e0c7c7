"""Threads and processes writing at once: every write lands, one claim wins."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from contract.store.backends import claim, new_run, run_threads
from laneflow.adapters.store import Store
from laneflow.domain.errors import Conflict
from laneflow.domain.records import Attempt, AttemptStatus, Event, ModelCall, RunStatus, StepChanges, StepStatus
from laneflow.domain.workers import LocalProcess


def test_twenty_threads_each_claiming_and_ending_a_different_step_all_land(store: Store) -> None:
    run = new_run(store, steps=20)

    def work(i: int) -> None:
        _, ref = claim(store, run, i, worker=LocalProcess(host="thread", pid=i))
        store.add_event(run.tenant, run.id, i, Event(text=f"working {i}"), attempt=ref)
        store.put_call(ref, ModelCall(id=f"c{i}", cost_usd=0.01))
        store.end_attempt(ref, AttemptStatus.completed, step=StepChanges(status=StepStatus.completed, cost_usd=0.01))

    assert run_threads(20, work) == [None] * 20
    after = store.get_run(run.tenant, run.id)
    assert all(s.status == StepStatus.completed and s.attempts == 1 for s in after.steps)
    assert all([e.text for e in s.events] == [f"working {s.index}"] and len(s.calls) == 1 for s in after.steps)
    assert round(sum(s.cost_usd for s in after.steps), 6) == 0.2
    attempts = store.list_attempts(run.tenant, run.id)
    assert [(a.index, a.n, a.status, a.worker) for a in attempts] == [
        (i, 1, AttemptStatus.completed, LocalProcess(host="thread", pid=i)) for i in range(20)
    ]


def test_twenty_threads_racing_to_claim_the_same_step_yield_exactly_one_winner(store: Store) -> None:
    run = new_run(store)
    results = run_threads(20, lambda i: claim(store, run, 0)[0])

    winners = [r for r in results if isinstance(r, Attempt)]
    assert len(winners) == 1
    assert all(isinstance(r, Conflict) for r in results if r is not winners[0])
    assert store.list_attempts(run.tenant, run.id) == winners
    step = store.get_step(run.tenant, run.id, 0)
    assert (step.status, step.attempts) == (StepStatus.running, 1)


def test_a_stop_requested_from_another_process_is_seen_by_this_one(store: Store) -> None:
    # Given a run this process is working on (a thread keeps writing its trace)
    run = new_run(store)
    _, ref = claim(store, run, 0)
    writing = threading.Event()
    done = threading.Event()
    errors: list[Exception] = []

    def keep_writing() -> None:
        while not done.is_set():
            try:
                store.add_event(run.tenant, run.id, 0, Event(text="still working"), attempt=ref)
            except Exception as error:  # reported below
                errors.append(error)
                return
            writing.set()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    writing.wait(10)
    # When a second process (a person's `laneflow stop`) opens the same store and stops it
    try:
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from laneflow.adapters.store import open_store;"
                "print(open_store(sys.argv[1]).request_stop(sys.argv[2], sys.argv[3]))",
                store.url,
                run.tenant,
                run.id,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        done.set()
        writer.join()
    # Then it set the stop, this process sees it, and neither side's writes failed
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "True"
    assert store.get_run(run.tenant, run.id).stop_requested is True
    assert store.request_stop(run.tenant, run.id) is False
    assert errors == []


_CLAIM_IN_A_CHILD = """
import os, sys, time, uuid
from laneflow.domain.errors import Conflict
from laneflow.domain.records import utcnow
from laneflow.adapters.store import open_store
url, tenant, run_id, go = sys.argv[1:]
store = open_store(url)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    print("won", store.claim_attempt(tenant, run_id, 0, token=uuid.uuid4().hex, started_at=utcnow()).n)
except Conflict:
    print("conflict")
"""


def test_processes_racing_to_claim_the_same_step_yield_exactly_one_winner(store: Store, tmp_path: Path) -> None:
    # Each process has its own connection, so only the database's transactions arbitrate.
    run = new_run(store)
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIM_IN_A_CHILD, store.url, run.tenant, run.id, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        go.touch()
        outcomes = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            child.kill()
    said = sorted(out.strip() for out, _ in outcomes)
    assert said == ["conflict", "conflict", "conflict", "won 1"], [err for _, err in outcomes]
    assert [a.n for a in store.list_attempts(run.tenant, run.id)] == [1]


def test_twenty_threads_adding_to_one_runs_cost_lose_none_of_it(store: Store) -> None:
    run = new_run(store, status=RunStatus.running)
    written = run_threads(20, lambda i: store.add_run_cost(run.tenant, run.id, 0.01))
    assert sorted(written) == [round(0.01 * n, 6) for n in range(1, 21)]  # type: ignore[type-var]  # each add saw every earlier one
    assert store.get_run(run.tenant, run.id, steps=False).cost_usd == 0.2
