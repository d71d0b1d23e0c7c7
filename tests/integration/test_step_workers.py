"""Step workers (LANEFLOW_STEP_WORKERS): the embedded engine answers RunStep in worker
processes beside its interpreter. The record is the one an in-process drive makes; the gate
holds across the processes (a lead's release is relayed); a worker that dies is a Lambda
that died (its step is caught as crashed, the run goes on) and is replaced; a person's
Ctrl-C reaches the steps running in workers. On both stores (the DynamoDB one under moto,
which the workers reach through the test's moto server)."""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from contract.store.backends import BACKENDS
from helpers import wait_for, write_workspace
from pydantic import SecretStr

from laneflow.adapters.engine import step_workers
from laneflow.adapters.engine.local import DriveResult, LocalEngine
from laneflow.adapters.engine.step_workers import StepWorkers
from laneflow.adapters.workers import local_worker
from laneflow.domain.lanes_report import lane_rows
from laneflow.domain.records import AttemptStatus, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


@pytest.fixture
def svc(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures"), step_workers=2))
    step_workers.close_all()


def fan_out(root: Path, stub: str, n: int, parallel: int = 4) -> Path:
    agents = {"worker": {"stub": stub}}
    flows = {"fan": {"steps": [{"agent": "worker", "each": list(range(n)), "parallel": parallel, "instruction": "Do {item}."}]}}
    return write_workspace(root / "ws", agents, flows)


def ready_engine(svc: Services) -> tuple[LocalEngine, StepWorkers]:
    """An engine whose step workers have started (so no call is answered in this process)."""
    engine = local_engine(svc)
    engine._start_step_workers()
    pool = engine.registry.step_workers
    assert pool is not None, "a file store with LANEFLOW_STEP_WORKERS=2 gets step workers"
    assert all(w.ready.wait(60) for w in pool.workers)
    return engine, pool


def test_a_gated_fan_out_runs_in_a_worker_process_with_one_cold_prefix_and_the_same_record(svc: Services, tmp_path: Path) -> None:
    ws = fan_out(tmp_path, "ttft_ms: 50\ndelay_ms: 100\ndid {item}", 8)
    engine, pool = ready_engine(svc)
    run = create_run(svc, ws, "fan", {}, options={"gate": True})
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    run = svc.store.get_run(run.tenant, run.id)
    assert run.status == RunStatus.completed
    assert [s.status for s in run.steps] == [StepStatus.completed] * 8
    assert sorted(cast(str, s.result) for s in run.steps) == sorted(f"did {i}" for i in range(8))
    # Every step was answered by one worker process (one run, one worker), none here.
    assert sorted(w.answered for w in pool.workers) == [0, 8]
    # Its attempts are this engine process's: it ends with it, as reconcile expects.
    for step in run.steps:
        (attempt,) = svc.store.list_attempts(run.tenant, run.id, step.index)
        assert attempt.worker == local_worker() and attempt.worker.pid == os.getpid()
    # The lead's release crossed the relay: one cold prefix, seven reads of it.
    (lane,) = lane_rows(run.steps)
    assert lane["steps"] == 8 and lane["cold_prefixes"] == 1
    lead, *siblings = run.steps
    opened = [e.data["opened_at"] for e in lead.events if e.type == "gate" and e.data and "opened_at" in e.data]
    assert opened, "the lead released no sibling when its reply began"
    assert all(s.started_at >= opened[0] for s in siblings), "a sibling started before the lead's reply began"


def test_a_worker_that_dies_mid_step_is_a_crashed_worker_its_run_goes_on_and_it_is_replaced(
    svc: Services, tmp_path: Path
) -> None:
    ws = fan_out(tmp_path, "delay_ms: 4000\nslow {item}", 1)
    engine, pool = ready_engine(svc)
    run = create_run(svc, ws, "fan", {})
    done: dict[str, DriveResult] = {}
    driving = threading.Thread(target=lambda: done.setdefault("result", engine.drive(run.tenant, run.id, tick_s=0.02)))
    driving.start()
    # When the step runs in its worker, the worker is killed
    wait_for(lambda: svc.store.get_step(run.tenant, run.id, 0).status == StepStatus.running, "the step's start", 60)
    (victim,) = [w for w in pool.workers if w.answered]
    os.killpg(victim.process.pid, signal.SIGKILL)
    driving.join(120)
    assert not driving.is_alive()
    # Then its attempt ended as a worker's failure, by the definition's Catch, not left running
    attempts = svc.store.list_attempts(run.tenant, run.id, 0)
    assert attempts[0].status == AttemptStatus.failed and "StepWorkerExited" in (attempts[0].reason or "")
    run = svc.store.get_run(run.tenant, run.id)
    assert all(s.status not in (StepStatus.running, StepStatus.pending) for s in run.steps)
    assert run.status.ended
    # and the next call of a run on that slot gets a new worker
    again = create_run(svc, fan_out(tmp_path / "again", "quick {item}", 1), "fan", {})
    second = engine.drive(again.tenant, again.id, tick_s=0.02)
    assert second.run.status == RunStatus.completed
    assert victim not in pool.workers and victim.dead.is_set()


def test_ctrl_c_reaches_the_steps_running_in_workers_and_the_run_stays_resumable(svc: Services, tmp_path: Path) -> None:
    ws = fan_out(tmp_path, "delay_ms: 20000\nslow {item}", 3, parallel=3)
    engine, _ = ready_engine(svc)
    run = create_run(svc, ws, "fan", {}, options={"gate": False})

    def interrupt_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            steps = svc.store.get_run(run.tenant, run.id).steps
            if sum(s.status == StepStatus.running for s in steps) == 3:
                break
            time.sleep(0.05)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        engine.drive(run.tenant, run.id, tick_s=0.02)
    stored = svc.store.get_run(run.tenant, run.id)
    assert not stored.status.ended and stored.driver is None  # resumable
    for step in stored.steps:
        assert step.status != StepStatus.running
        # The step's 20 s model call was cut short (the worker's step saw the worker leaving):
        # it never answered
        assert step.calls == [] and step.result is None, step
        for attempt in svc.store.list_attempts(run.tenant, run.id, step.index):
            assert attempt.status != AttemptStatus.running


def test_a_store_in_memory_never_gets_step_workers(tmp_path: Path) -> None:
    from laneflow.adapters.store import open_store

    svc = for_store(open_store("sqlite:///:memory:"), Settings(step_workers=2))
    engine = local_engine(svc)
    engine._start_step_workers()
    assert engine.registry.step_workers is None
    assert not step_workers.usable(":memory:") and step_workers.usable("sqlite:///tmp/x.db")


def test_a_claude_lane_spreads_over_the_workers_and_still_pays_one_cold_prefix(tmp_path: Path) -> None:
    """Only the stub's pretend cache lives in a worker's process; a Claude model's is the
    API's. So a Claude lane's released siblings go to whichever worker has the fewest calls
    in flight (here: the one its lead is not running in, first), and the gate still holds:
    one cache write, every sibling reads it."""
    import shutil

    from helpers import FIXTURES

    from laneflow.adapters.store import open_store
    from laneflow_dev.imitation import MessagesImitation

    key = "sk-test-0123456789abcdef"
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    with MessagesImitation(ttft_ms=300, token_ms=1, api_keys={key}) as api:
        settings = Settings(
            anthropic_api_key=SecretStr(key), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"), step_workers=2
        )
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        try:
            engine, pool = ready_engine(svc)
            run = create_run(svc, ws, "fanout", {})
            result = engine.drive(run.tenant, run.id, tick_s=0.02)
            stats = api.stats()
        finally:
            step_workers.close_all()
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    assert [s.status for s in result.run.steps] == [StepStatus.completed] * 4
    # Both workers answered steps of this one run (a stub run's all go to one: see above).
    assert sorted(w.answered > 0 for w in pool.workers) == [True, True]
    assert sum(w.answered for w in pool.workers) == 4
    assert stats["cache_writes"] == 1 and stats["cache_reads"] == 3


def test_only_a_lane_whose_model_caches_outside_the_process_spreads() -> None:
    assert step_workers.spreads({"lane": "analyst@claude-sonnet-4-6"})
    assert step_workers.spreads({"lane": "a@b@c"})  # a model name may hold an @
    assert not step_workers.spreads({"lane": "worker@stub"})
    assert not step_workers.spreads({"lane": "rescue"})  # a rescue names no lane's model
    assert not step_workers.spreads({})
