"""Chained flows (`then: {flow, input}`): a completed run starts the next flow's run once,
its input filled from the finished run, through the real definition on the embedded engine,
on both stores; never for a failed or stopped run; never twice, however often the run's end
is told (a re-delivered EndRun, a reconcile); its drive started where the deployment starts
drives (the cloud's path, a `DriveStarter`), else driven by `laneflow run`; listed as
`then_run` in --json, show and the API; and `laneflow check` of `then:`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, drive, write_workspace

from laneflow.adapters.store import open_store
from laneflow.adapters.workers import Liveness
from laneflow.domain.flow import check_workspace
from laneflow.domain.messages import DriveRef, EndRunRequest
from laneflow.domain.records import RunStatus, StepStatus
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.end_run import end_run
from laneflow.usecases.reconcile import reconcile
from laneflow.usecases.start_run_idempotent import idempotent_run_id
from laneflow.wiring import for_store, local_engine

THEN = {
    "flow": "publish",
    "input": {
        "brief": "{result.writer}",
        "facts": "{data.scout}",
        "topic": "{input.topic}",
        "note": "from {result.writer} on {input.topic}",
    },
}


def desk(tmp_path: Path, *, then: dict[str, Any] | None = None, writer_stub: str = "The brief.") -> Path:
    agents: dict[str, dict[str, Any]] = {
        "scout": {"stub": '```json\n{"facts": [1, 2]}\n```'},
        "writer": {"stub": writer_stub},
        "publisher": {"stub": "Published."},
    }
    flows: dict[str, dict[str, Any]] = {
        "brief": {
            "steps": [{"agent": "scout", "output": "json"}, {"agent": "writer", "instruction": "Write about {input.topic}."}],
            "then": then or THEN,
        },
        "publish": {
            "input": {"type": "object", "required": ["brief"]},
            "steps": [{"agent": "publisher", "instruction": "Publish: {input.brief}"}],
        },
    }
    return write_workspace(tmp_path / "ws", agents, flows)


class CountingDrives:
    """A DriveStarter that records what it was asked to start (the cloud's StepFunctionsDrives)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append(run_id)
        return f"exec-{len(self.started)}"


def test_a_completed_run_starts_its_chained_run_once_with_the_input_filled_from_it(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    ws = desk(tmp_path)

    first = drive(svc, ws, "brief", {"topic": "tides"})

    assert first.status == RunStatus.completed, first.error
    assert first.then_run == idempotent_run_id("local", f"then:{first.id}")
    chained = svc.store.get_run("local", first.then_run)
    assert chained.status == RunStatus.queued and chained.flow == "publish"
    assert chained.input == {
        "brief": "The brief.",
        "facts": {"facts": [1, 2]},
        "topic": "tides",
        "note": "from The brief. on tides",
    }
    assert chained.options["chained_from"] == first.id and chained.options["chain_depth"] == 1
    assert chained.steps[0].instruction == "Publish: The brief."
    assert first.public()["then_run"] == chained.id

    # Its end told again, a reconcile, and again: still one chained run.
    end_run(svc, EndRunRequest(run=DriveRef(tenant="local", run_id=first.id)))
    reconcile(svc, Liveness(), redrive=None)
    end_run(svc, EndRunRequest(run=DriveRef(tenant="local", run_id=first.id)))
    assert sorted(r.flow for r in svc.store.list_runs("local")) == ["brief", "publish"]
    assert svc.store.get_run("local", first.id, steps=False).then_run == chained.id

    # The chained run drives like any other, and chains no further.
    done = local_engine(svc).drive("local", chained.id, tick_s=0.02).run
    assert done.status == RunStatus.completed and done.steps[0].result == "Published." and done.then_run is None


def test_where_drives_can_be_started_the_chained_runs_drive_starts_once(svc: Services, tmp_path: Path) -> None:
    svc.drives = drives = CountingDrives()
    ws = desk(tmp_path)
    first = drive(svc, ws, "brief", {"topic": "tides"})
    for _ in range(3):
        end_run(svc, EndRunRequest(run=DriveRef(tenant="local", run_id=first.id)))
    assert drives.started == [first.then_run]


def test_a_failed_or_stopped_run_starts_no_chained_run(svc: Services, tmp_path: Path) -> None:
    ws = desk(tmp_path, writer_stub="fail: no ink")
    failed = drive(
        svc,
        ws,
        "brief",
        {"topic": "tides"},
    )
    assert failed.status == RunStatus.failed and failed.then_run is None

    ws2 = desk(tmp_path / "two")
    from laneflow.usecases.start_run import create_run
    from laneflow.usecases.stop import stop_run

    run = create_run(svc, ws2, "brief", {"topic": "tides"})
    stop_run(svc, "local", run.id)
    stopped = svc.store.get_run("local", run.id, steps=False)
    assert stopped.status == RunStatus.failed and stopped.then_run is None
    assert sorted(r.flow for r in svc.store.list_runs("local")) == ["brief", "brief"]


def test_a_chained_input_that_does_not_fit_its_flow_is_recorded_on_the_finished_run(svc: Services, tmp_path: Path) -> None:
    ws = desk(tmp_path, then={"flow": "publish", "input": {"other": "x"}})
    first = drive(svc, ws, "brief", {"topic": "tides"})
    assert first.status == RunStatus.completed and first.then_run is None
    assert "the input does not fit flow 'publish'" in first.options["then_error"] and "brief" in first.options["then_error"]
    assert [r.flow for r in svc.store.list_runs("local")] == ["brief"]


def test_laneflow_run_drives_the_chained_run_too_and_json_prints_the_first_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = desk(tmp_path)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    code = main(["run", str(ws), "brief", "--input", '{"topic": "tides"}', "--store", store, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)  # stdout is the first run's record alone
    assert record["flow"] == "brief" and record["then_run"]
    assert main(["show", record["then_run"], "--store", store, "--json"]) == 0
    chained = json.loads(capsys.readouterr().out)
    assert chained["status"] == "completed" and chained["steps"][0]["status"] == StepStatus.completed
    assert main(["show", record["id"], "--store", store]) == 0
    assert f"chain: then {record['then_run']}" in capsys.readouterr().out


def test_check_refuses_a_then_naming_an_unknown_flow_or_agents_not_in_the_flow(tmp_path: Path) -> None:
    ws = desk(tmp_path, then={"flow": "publsh", "input": {"a": "{result.editor}", "b": "{data.scout} and {data.ghost}"}})
    problems = [(p.file, p.field, p.message) for p in check_workspace(ws)]
    assert (
        "flows/brief.yaml",
        "then.flow",
        "unknown flow 'publsh' (flows/publsh.yaml not found) (did you mean 'publish'?)",
    ) in problems
    agents = "its agents: scout, writer"
    assert (
        "flows/brief.yaml",
        "then.input",
        f"{{result.editor}} names agent 'editor', which is not a step of this flow ({agents})",
    ) in problems
    assert (
        "flows/brief.yaml",
        "then.input",
        f"{{data.ghost}} names agent 'ghost', which is not a step of this flow ({agents})",
    ) in problems
    assert len(problems) == 3, problems
    (ws / "flows" / "brief.yaml").write_text("steps:\n  - agent: scout\nthen: publish\n")
    [(_, line, field, message)] = [(p.file, p.line, p.field, p.message) for p in check_workspace(ws)]
    assert (line, field) == (3, "then") and message.startswith("then is a mapping")
    (ws / "flows" / "brief.yaml").write_text("steps:\n  - agent: scout\nthen:\n  flw: publish\n  input: [1]\n")
    found = {(p.line, p.field): p.message for p in check_workspace(ws)}
    assert "did you mean 'flow'" in found[(4, "then.flw")]
    assert "then.input is a mapping" in found[(5, "then.input")]


def test_a_chained_run_nothing_drives_is_started_by_reconcile_as_in_the_cloud(svc: Services, tmp_path: Path) -> None:
    """Where the run's end cannot start drives (EndRun in the cloud), the chained run waits
    queued, and reconcile's re-drive of queued runs starts it."""
    first = drive(svc, desk(tmp_path), "brief", {"topic": "tides"})
    redriven: list[str] = []
    reconcile(svc, Liveness(), redrive=lambda run: redriven.append(run.id))
    assert redriven == [first.then_run]


def test_laneflow_run_says_it_drives_the_chained_run_and_prints_both_summaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = desk(tmp_path)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["run", str(ws), "brief", "--input", '{"topic": "tides"}', "--store", store]) == 0
    captured = capsys.readouterr()
    assert "chains to flow publish: run run-k-" in captured.err
    assert captured.out.count(": completed (") == 2


def interrupted(svc: Services, run_id: str) -> None:
    """Leave the run as a killed `laneflow run` would: running, driven once by a process that
    is gone, its first step's attempt running on that process."""
    import socket
    import subprocess

    from laneflow.domain.records import RunChanges, utcnow
    from laneflow.domain.workers import LocalProcess

    child = subprocess.Popen(["true"])
    child.wait()
    gone = LocalProcess(host=socket.gethostname(), pid=child.pid, started="gone")
    svc.store.update_run("local", run_id, RunChanges(status=RunStatus.running, driver=gone, driven_at=utcnow()), add_drives=1)
    svc.store.claim_attempt("local", run_id, 0, token="t-gone", started_at=utcnow(), worker=gone)


def test_one_laneflow_reconcile_drives_an_interrupted_run_and_the_run_it_chains_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from laneflow.usecases.start_run import create_run

    store = f"sqlite:///{tmp_path / 'cli.db'}"
    svc = for_store(open_store(store), Settings(capture_dir=str(tmp_path / "captures")))
    run = create_run(svc, desk(tmp_path), "brief", {"topic": "tides"})
    interrupted(svc, run.id)

    assert main(["reconcile", "--store", store, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    first = svc.store.get_run("local", run.id)
    assert first.status == RunStatus.completed and first.then_run
    chained = svc.store.get_run("local", first.then_run)
    assert chained.status == RunStatus.completed, chained.error  # driven by that same reconcile, not left queued
    assert chained.steps[0].result == "Published." and chained.drives == 1
    assert report["redriven"] == [run.id, chained.id]
