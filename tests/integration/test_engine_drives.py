"""Drives at once in one process: each execution's handlers use the services of the drive
that started it (its own store), whatever else the process drives at the same time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import pacing_workspace, write_workspace

from laneflow.adapters.engine.local import LocalDrives, _backend
from laneflow.adapters.store import open_store
from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import RunStatus
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


@pytest.mark.slow
def test_two_drives_over_two_stores_run_at_once_and_each_writes_only_its_own_store(tmp_path: Path) -> None:
    # Given two stores, each with its own engine, and a slow run in one, a quick run in the other
    ws = pacing_workspace(tmp_path, slow_ms=4000)
    svc_a = for_store(open_store(f"sqlite:///{tmp_path / 'a.db'}"), Settings(capture_dir=str(tmp_path / "ca")))
    svc_b = for_store(open_store(f"sqlite:///{tmp_path / 'b.db'}"), Settings(capture_dir=str(tmp_path / "cb")))
    slow = create_run(svc_a, ws, "slow")
    quick = create_run(svc_b, ws, "quick")
    results: dict[Any, Any] = {}
    # When the slow one is driven, and the quick one is started while it runs
    driving = threading.Thread(
        target=lambda: results.setdefault("slow", local_engine(svc_a).drive(slow.tenant, slow.id, tick_s=0.02))
    )
    driving.start()
    results["quick"] = local_engine(svc_b).drive(quick.tenant, quick.id, tick_s=0.02)
    # Then the quick one ended while the slow one still ran, each in its own store only
    assert results["quick"].run.status == RunStatus.completed
    assert driving.is_alive(), "the quick drive waited for the slow one"
    driving.join(60)
    assert results["slow"].run.status == RunStatus.completed
    assert results["slow"].run.steps[0].result == "slow done." and results["quick"].run.steps[0].result == "quick done."
    with pytest.raises(RunNotFound):
        svc_a.store.get_run(quick.tenant, quick.id)
    with pytest.raises(RunNotFound):
        svc_b.store.get_run(slow.tenant, slow.id)


def test_serve_s_drives_forget_each_execution_once_it_ended_and_a_bad_pool_is_refused(tmp_path: Path) -> None:
    ws = pacing_workspace(tmp_path, slow_ms=4000)
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'a.db'}"), Settings(capture_dir=str(tmp_path / "ca")))
    drives = LocalDrives(lambda: local_engine(svc), pool=1)
    run = create_run(svc, ws, "quick")
    drives.start(run.tenant, run.id)
    drives.join(60)
    assert svc.store.get_run(run.tenant, run.id, steps=False).status == RunStatus.completed
    kept = [e.execution_arn for m in _backend().state_machines for e in m.executions if run.id in e.execution_arn]
    assert kept == []
    with pytest.raises(ValueError):
        LocalDrives(lambda: local_engine(svc), pool=0)


@pytest.mark.parametrize("budget", [18_000, 200], ids=["one-execution", "continued"])
def test_a_drive_serve_forgot_leaves_nothing_of_it_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    # Given serve's drives, and gated fan-outs (Map iterations, callback tokens, NextGroup),
    # in one execution or, on a tight history budget, continued in fresh ones (NextDrive)
    import gc
    import weakref

    from moto.stepfunctions.models import StateMachine

    from laneflow.adapters.engine import local, moto_patches

    ws = write_workspace(
        tmp_path / "ws",
        {"worker": {"stub": "Done with {item}."}},
        {"fan": {"description": "gated fan-outs", "steps": [{"agent": "worker", "each": "input.items"}] * 3}},
    )
    svc = for_store(
        open_store(f"sqlite:///{tmp_path / 'a.db'}"), Settings(capture_dir=str(tmp_path / "ca"), history_budget=budget)
    )
    engines, ended = [], []
    forget = moto_patches.forget

    def watching(backend: Any, arn: str) -> None:  # what the drive leaves behind, just before it is forgotten
        execution = local.LocalEngine._execution(arn)
        ended.append((weakref.ref(execution), weakref.ref(execution.state_machine)))
        forget(backend, arn)

    monkeypatch.setattr(moto_patches, "forget", watching)
    released = []
    monkeypatch.setattr(local, "release_free_memory", lambda: released.append(len(ended)))
    drives = LocalDrives(lambda: engines.append(weakref.ref(local_engine(svc))) or engines[-1](), pool=1)  # type: ignore[arg-type, func-returns-value, return-value]
    run = create_run(svc, ws, "fan", {"items": [f"item-{i}" for i in range(4)]}, options={"gate": True})
    assert local_engine(svc).state_machine_arn  # the state machine itself is made (and kept) once
    tracked = len(StateMachine.instances_tracked)  # type: ignore[attr-defined]
    # When it is driven to its end
    drives.start(run.tenant, run.id)
    drives.join(60)
    assert svc.store.get_run(run.tenant, run.id, steps=False).status == RunStatus.completed
    # Then nothing of it is left: not its execution nor its snapshot of the state machine
    # (moto's dashboard list of models kept those), not its engine, nor any table keyed by it
    gc.collect()
    assert len(ended) == 1 if budget == 18_000 else len(ended) >= 2
    assert engines
    assert [(e(), m()) for e, m in ended] == [(None, None)] * len(ended)
    assert engines[0]() is None
    # What the drive freed was handed back after each execution was forgotten: each one it
    # continued from as the next ran, and its last one once the drive ended
    assert released == list(range(1, len(ended) + 1))
    assert len(StateMachine.instances_tracked) == tracked  # type: ignore[attr-defined]
    assert not [arn for arn in {**local._registries, **local._sandboxes} if run.id in arn]
    assert not [m for m in _backend().state_machines for e in m.executions if run.id in e.execution_arn]
