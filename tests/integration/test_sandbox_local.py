"""Sandboxed steps on the embedded engine: the definition's sandbox state is answered by a
child process running the sandbox worker, which works in a scratch copy of the workspace
and relays its callbacks to the engine. On both stores (the DynamoDB one under moto, which
the child reaches through the test's moto server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from contract.store.backends import dynamodb_store, sqlite_store

from laneflow.domain.records import RunStatus, StepStatus
from laneflow.domain.workers import LocalProcess
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

STORES = {"sqlite": sqlite_store, "dynamodb": dynamodb_store}


def workspace(root: Path, stub: str, *, sandbox: bool = True, fan_out: int = 1, parallel: int = 1) -> Path:
    ws = root / "ws-sandbox"
    (ws / "agents" / "builder" / "outputs").mkdir(parents=True)
    (ws / "agents" / "builder" / "knowledge").mkdir()
    (ws / "knowledge").mkdir()
    (ws / "storage").mkdir()
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("Be brief.\n")
    (ws / "knowledge" / "style.md").write_text("plain\n")
    (ws / "agents" / "builder" / "agent.md").write_text(
        f"---\ndescription: builds\nsandbox: {'true' if sandbox else 'false'}\nstub: {stub!r}\n---\nYou build.\n"
    )
    each = f"    each: {list(range(fan_out))}\n    parallel: {parallel}\n" if fan_out > 1 else ""
    (ws / "flows" / "build.yaml").write_text(f"steps:\n  - agent: builder\n{each}    instruction: Build {{item}}.\n")
    return ws


@pytest.fixture(params=sorted(STORES))
def svc(request, tmp_path):
    with STORES[request.param](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


def drive(svc, ws: Path, flow: str = "build"):
    run = create_run(svc, ws, flow, {})
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)


def test_a_sandboxed_stub_step_runs_whole_in_a_child_process_through_the_definition(svc, tmp_path):
    ws = workspace(tmp_path, "built {item}")
    result = drive(svc, ws)
    assert result.execution_status == "SUCCEEDED", (result.error, result.cause)
    run = svc.store.get_run(result.run.tenant, result.run.id)
    assert run.status == RunStatus.completed
    (step,) = run.steps
    assert step.status == StepStatus.completed and step.result.startswith("built")
    (attempt,) = svc.store.list_attempts(run.tenant, run.id)
    assert isinstance(attempt.worker, LocalProcess) and attempt.worker.pid != os.getpid()
    assert any("sandbox worker" in e.text for e in step.events)
    history = local_engine(svc).history(result.execution_arn)
    assert any(e["type"] == "TaskSubmitted" and "ecs" in str(e) for e in history)


def test_an_unsandboxed_step_still_runs_in_this_process(svc, tmp_path):
    ws = workspace(tmp_path, "plain", sandbox=False)
    result = drive(svc, ws)
    (attempt,) = svc.store.list_attempts(result.run.tenant, result.run.id)
    assert attempt.worker.pid == os.getpid()
