"""Runs of any size inside Step Functions' limits, proved on the embedded engine at a size CI
can afford by lowering the history budget (Settings.history_budget): a drive continues as a
new execution when its budget is spent, a lane larger than the budget runs in windows across
executions with one lead, a crash inside a window recovers exactly-once, a stop reaches
every window, and every execution's history and every state's input and output stay under
the bounds (read from get_execution_history)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import data_of, spans_of, stamped, stderr_of, wait_for_run
from types_boto3_stepfunctions import SFNClient

from laneflow.adapters.engine.local import LocalEngine, _backend
from laneflow.adapters.store import open_store
from laneflow.domain.records import AttemptStatus, Run, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store
from laneflow.wiring import local_engine as wired_engine

STATE_BYTES = 200_000
EXE = Path(sys.executable).parent / "laneflow"


def workspace(root: Path, *, groups: int = 1, parallel: int | None = None, stub: str = "Done with {item}.") -> Path:
    """A workspace whose flow `fan` is `groups` groups, each a fan-out of `input.items` by
    one agent."""
    ws = root / "ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nA workspace for large runs.\n")
    (ws / "agents" / "worker" / "agent.md").write_text(f"---\nstub: {json.dumps(stub)}\n---\nYou do one item.\n")
    cap = f"    parallel: {parallel}\n" if parallel else ""
    entries = "".join(
        f'  - agent: worker\n    each: input.items\n{cap}    instruction: "Group {g}: {{item}}."\n' for g in range(groups)
    )
    (ws / "flows" / "fan.yaml").write_text(
        "description: fan-outs\ninput:\n  type: object\n  properties:\n    items: {type: array}\nsteps:\n" + entries
    )
    return ws


def services(tmp_path: Path, budget: int) -> Services:
    return for_store(
        open_store(f"sqlite:///{tmp_path / f'b{budget}.db'}"),
        Settings(history_budget=budget, capture_dir=str(tmp_path / "captures")),
    )


def entered(history: list[dict[str, Any]], state: str) -> int:
    return sum(1 for e in history if (e.get("stateEnteredEventDetails") or {}).get("name") == state)


def largest_state_bytes(history: list[dict[str, Any]]) -> int:
    sizes = [0]
    for event in history:
        for value in event.values():
            if isinstance(value, dict):
                sizes += [len(str(value[k]).encode()) for k in ("input", "output") if k in value]
    return max(sizes)


def local_engine(svc: Services) -> LocalEngine:
    """The engine as the CLI has it, keeping the history of each execution it retires (an
    execution its drive continued from is dropped from the interpreter once the next runs)."""
    engine = wired_engine(svc)
    retired: dict[str, list[dict[str, Any]]] = {}
    engine.on_retire = retired.__setitem__
    RETIRED[id(engine)] = retired
    return engine


RETIRED: dict[int, dict[str, list[dict[str, Any]]]] = {}


def assert_within_bounds(engine: Any, result: Any, budget: int) -> list[list[dict[str, Any]]]:
    """Every execution of the drive recorded at most `budget` events, and no state's input or
    output reached 200 KB; each but the last ended in NextDrive, the last in EndRun. Each but
    the last was dropped from the interpreter when the next one ran: a drive holds one."""
    retired = RETIRED[id(engine)]
    assert list(retired) == result.executions[:-1], "each execution the drive continued from is retired, in order"
    held = {e.execution_arn for m in _backend().state_machines for e in m.executions}
    assert not held & set(retired), "a retired execution is still held by the interpreter"
    histories = [*(retired[arn] for arn in result.executions[:-1]), engine.history(result.executions[-1])]
    for n, history in enumerate(histories):
        assert len(history) <= budget, f"execution {n} recorded {len(history)} events, over its budget of {budget}"
        assert largest_state_bytes(history) < STATE_BYTES
        last = "EndRun" if n == len(histories) - 1 else "NextDrive"
        assert entered(history, last) == 1, f"execution {n} did not end in {last}"
    return histories


def comparable(run: Run) -> list[tuple[Any, ...]]:
    return [(s.index, s.group, str(s.status), s.result, s.attempts, s.skip_reason) for s in run.steps]


@pytest.mark.slow
def test_a_run_that_spends_its_history_budget_continues_as_new_and_ends_as_it_would_have(tmp_path: Path) -> None:
    # Given 4 groups of 10 and a budget that holds about one group per execution
    ws = workspace(tmp_path, groups=4)
    items = {"items": [f"i{n}" for n in range(10)]}
    plain_svc, tight_svc = services(tmp_path, 18_000), services(tmp_path, 200)
    plain = local_engine(plain_svc)
    run = create_run(plain_svc, ws, "fan", items)
    alone = plain.drive(run.tenant, run.id, tick_s=0.02)
    tight = local_engine(tight_svc)
    run = create_run(tight_svc, ws, "fan", items)
    # When it is driven
    result = tight.drive(run.tenant, run.id, tick_s=0.02)
    # Then it went on in fresh executions and ended with the same record
    assert len(alone.executions) == 1
    assert len(result.executions) >= 3
    assert result.run.status == RunStatus.completed, result.run.error
    assert comparable(result.run) == comparable(alone.run)
    assert result.run.drives == 1, "a continuation is not a drive (the crash limit counts drives)"
    assert result.run.segments == len(result.executions) - 1
    assert result.run.execution == result.executions[-1]
    assert_within_bounds(tight, result, 200)


def test_a_lane_larger_than_the_budget_runs_in_windows_with_one_lead_and_siblings_passing_its_gate(tmp_path: Path) -> None:
    # Given one gated lane of 30 at parallel 3, and a budget that holds about 10 steps
    ws = workspace(tmp_path, parallel=3, stub="ttft_ms: 30\ndelay_ms: 30\nDone with {item}.")
    svc = services(tmp_path, 200)
    engine = local_engine(svc)
    run = create_run(svc, ws, "fan", {"items": [f"i{n}" for n in range(30)]})
    # When it is driven
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    # Then it ran in windows, one per execution or more, and completed
    assert result.run.status == RunStatus.completed, result.run.error
    histories = assert_within_bounds(engine, result, 200)
    assert len(histories) >= 3
    # with one lead for the whole lane, and siblings (waiting on the gate) in every execution
    assert sum(entered(h, "RunStarter") for h in histories) == 1
    assert entered(histories[0], "RunStarter") == 1
    assert all(entered(h, "WaitForLead") > 0 for h in histories)
    assert sum(entered(h, "WaitForLead") for h in histories) == 29
    lead = result.run.steps[0]
    # the lead released its waiting siblings when its reply began (and its reserve when it ended)
    release = [e for e in lead.events if e.type == "gate" and "released" in e.text][0]
    opened = data_of(release)["opened_at"]  # its reply began: the release, and its trace line, come after
    later = [s for s in result.run.steps if s.index >= 15]
    assert all(started >= opened for started in stamped(s.started_at for s in result.run.steps[1:]))
    # siblings of later windows found the gate open: they never waited for it
    assert not any(e.type == "gate" for s in later for e in s.events)
    # and `parallel:` still capped the lane in every window
    spans = spans_of(result.run.steps)
    assert max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans) <= 3


def test_a_stop_reaches_every_window(tmp_path: Path) -> None:
    # Given a lane of 60 slow-ish steps in windows of about 20, one an execution
    ws = workspace(tmp_path, parallel=5, stub="delay_ms: 150\nDone with {item}.")
    svc = services(tmp_path, 200)
    engine = local_engine(svc)
    run = create_run(svc, ws, "fan", {"items": [f"i{n}" for n in range(60)]}, options={"gate": False})

    def stop_in_the_second_execution() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = svc.store.get_run(run.tenant, run.id, steps=False)
            if now.segments >= 1:
                svc.store.request_stop(run.tenant, run.id)
                return
            time.sleep(0.02)

    stopper = threading.Thread(target=stop_in_the_second_execution)
    stopper.start()
    # When it is stopped while its second window runs
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    stopper.join()
    # Then the run ends failed: the second window's steps not yet started when the stop came
    # are skipped as they reach their start, and the third window, never launched, is skipped
    # whole by the drive
    final = result.run
    assert final.status == RunStatus.failed and final.stop_requested and final.finished_at
    assert len(result.executions) == 2  # no execution was started after the stop
    assert not [s.index for s in final.steps if s.status in (StepStatus.pending, StepStatus.running)]
    skipped = [s for s in final.steps if s.status == StepStatus.skipped]
    assert skipped and all(s.skip_reason and s.skip_reason.startswith("run stopped") for s in skipped)
    never_launched = [s.index for s in skipped if s.skip_reason == "run stopped"]
    assert 59 in never_launched and len(never_launched) >= 15  # the last window, whole
    assert final.steps[0].status == StepStatus.completed


@pytest.mark.slow
def test_a_crash_inside_a_later_window_is_reconciled_and_completes_exactly_once(tmp_path: Path) -> None:
    # Given a lane of 30 in windows of about 10, whose runner is killed in its second window
    ws = workspace(tmp_path, parallel=3)
    store = f"sqlite:///{tmp_path / 'crash.db'}"
    environ = {**os.environ, "LANEFLOW_HISTORY_BUDGET": "200"}
    crashed = subprocess.run(
        [
            str(EXE),
            "run",
            str(ws),
            "fan",
            "--input",
            json.dumps({"items": [f"i{n}" for n in range(30)]}),
            "--store",
            store,
            "--quiet",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**environ, "LANEFLOW_CRASH_AT": "after-result:15"},
    )
    assert crashed.returncode == -9, crashed.stderr[-800:]
    db = open_store(store)
    [before] = db.list_runs("local")
    assert before.status == RunStatus.running and before.segments >= 1, "the crash was not in a later window"
    # When reconcile re-drives it
    reconciled = subprocess.run(
        [str(EXE), "reconcile", "--store", store, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=environ,
    )
    assert reconciled.returncode == 0, reconciled.stderr[-800:]
    assert before.id in json.loads(reconciled.stdout)["redriven"]
    # Then it completes, every step completed once, and only the crash counted as a drive
    run = db.get_run("local", before.id)
    assert run.status == RunStatus.completed, run.error
    assert run.drives == 2
    assert all(s.status == StepStatus.completed and s.result for s in run.steps)
    completed = Counter(a.index for a in db.list_attempts(run.tenant, run.id) if a.status == AttemptStatus.completed)
    assert set(completed) == set(range(30)) and set(completed.values()) == {1}
    assert not [a for a in db.list_attempts(run.tenant, run.id) if a.status == AttemptStatus.running]


@pytest.fixture
def sfn(monkeypatch: pytest.MonkeyPatch) -> Iterator[SFNClient]:
    """Step Functions under moto, executing its state machines."""
    from moto import mock_aws

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        import boto3

        yield boto3.client("stepfunctions", region_name="us-east-1")


def test_reconcile_leaves_a_run_whose_newest_execution_runs_though_an_older_one_ended(
    svc: Services, sfn: SFNClient, tmp_path: Path
) -> None:
    """The cloud path: NextDrive starts the continuation through Step Functions and records it;
    the segment it continued then ends SUCCEEDED. Reconcile asks Step Functions about the
    run's newest execution, finds it running, and re-drives nothing."""
    from laneflow.adapters.aws.stepfunctions import StepFunctionsDrives, execution_alive
    from laneflow.adapters.workers import Liveness
    from laneflow.domain.messages import DriveRef, NextDriveRequest
    from laneflow.domain.records import RunChanges
    from laneflow.domain.workers import StepFunctionsExecution
    from laneflow.usecases.next_drive import next_drive
    from laneflow.usecases.reconcile import Reconciler

    # A stand-in for the flow: a first segment ends at once, a continuation (its input has a
    # segment) stays running.
    definition = {
        "StartAt": "Which",
        "States": {
            "Which": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.segment", "IsPresent": True, "Next": "Work"}],
                "Default": "Done",
            },
            "Work": {"Type": "Wait", "Seconds": 120, "End": True},
            "Done": {"Type": "Succeed"},
        },
    }
    machine = sfn.create_state_machine(
        name="laneflow-flow", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/x"
    )["stateMachineArn"]
    import dataclasses

    drives = StepFunctionsDrives(machine, client=sfn)
    svc = dataclasses.replace(svc, drives=drives, continuations=drives)
    run = create_run(svc, workspace(tmp_path), "fan", {"items": ["a"]})
    first = drives.start(run.tenant, run.id)
    svc.store.update_run(
        run.tenant,
        run.id,
        RunChanges(status=RunStatus.running, execution=first, driver=StepFunctionsExecution(execution=first)),
        add_drives=1,
    )
    request = NextDriveRequest(run=DriveRef(tenant=run.tenant, run_id=run.id, drive=1), execution=first)
    try:
        went_on = next_drive(svc, request)
        again = next_drive(svc, request)  # a retried NextDrive starts no second execution
        assert again.execution == went_on.execution and went_on.segment == 1
        deadline = time.monotonic() + 10
        while sfn.describe_execution(executionArn=first)["status"] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sfn.describe_execution(executionArn=first)["status"] == "SUCCEEDED"
        assert sfn.describe_execution(executionArn=went_on.execution)["status"] == "RUNNING"  # type: ignore[arg-type]
        stored = svc.store.get_run(run.tenant, run.id, steps=False)
        assert stored.execution == went_on.execution and stored.driver == StepFunctionsExecution(execution=went_on.execution)
        assert (stored.drives, stored.segments) == (1, 1)
        report = Reconciler(
            svc,
            Liveness(execution_alive=execution_alive(sfn)),
            redrive=lambda r: pytest.fail("re-drove a run whose newest execution runs"),
        ).run()
        assert report.redriven == [] and report.closed == [] and report.to_redrive == []
        # and once the newest is gone too, the run is re-driven
        sfn.stop_execution(executionArn=went_on.execution)  # type: ignore[arg-type]
        while sfn.describe_execution(executionArn=went_on.execution)["status"] == "RUNNING" and time.monotonic() < deadline + 10:  # type: ignore[arg-type]
            time.sleep(0.05)
        redriven: list[str] = []
        Reconciler(svc, Liveness(execution_alive=execution_alive(sfn)), redrive=lambda r: redriven.append(r.id)).run()
        assert redriven == [run.id]
    finally:
        for e in sfn.list_executions(stateMachineArn=machine)["executions"]:
            if e["status"] == "RUNNING":
                sfn.stop_execution(executionArn=e["executionArn"])


@pytest.mark.slow
def test_ctrl_c_in_a_later_execution_leaves_the_run_resumable_and_resume_follows_it_to_its_end(tmp_path: Path) -> None:
    # Given `laneflow run` of a lane of 30 slow-ish steps in windows of about 10
    import signal

    ws = workspace(tmp_path, parallel=3, stub="delay_ms: 200\nDone with {item}.")
    store = f"sqlite:///{tmp_path / 'int.db'}"
    environ = {**os.environ, "LANEFLOW_HISTORY_BUDGET": "200"}
    proc = subprocess.Popen(
        [
            str(EXE),
            "run",
            str(ws),
            "fan",
            "--input",
            json.dumps({"items": [f"i{n}" for n in range(30)]}),
            "--store",
            store,
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=environ,
    )
    db, run_id = wait_for_run(
        proc,
        tmp_path / "int.db",
        store,
        lambda db, run: run.segments >= 1 and any(s.status == StepStatus.running for s in db.get_steps("local", run.id)),
        poll_s=0.02,
    )
    assert run_id and db, (
        f"the run never reached its second execution: {stderr_of(proc) if proc.poll() is not None else 'timeout'}"
    )
    # When the person presses Ctrl-C while the second execution runs
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # Then the run is left resumable, and `laneflow resume` drives it through its later executions
    assert proc.returncode == 130, err
    left = db.get_run("local", run_id)
    assert left.status == RunStatus.running and left.driver is None and left.drives == 1
    assert not [a for a in db.list_attempts("local", run_id) if a.status == AttemptStatus.running]
    resumed = subprocess.run(
        [str(EXE), "resume", run_id, "--store", store, "--quiet"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=environ,
    )
    assert resumed.returncode == 0, resumed.stderr[-800:]
    run = db.get_run("local", run_id)
    assert run.status == RunStatus.completed and run.drives == 2 and run.segments >= 2
    assert all(s.status == StepStatus.completed and s.result for s in run.steps)


def test_serve_s_drives_forget_every_execution_of_a_drive_that_continued(tmp_path: Path) -> None:
    """`laneflow serve` keeps nothing of a finished drive, however many executions it took."""
    from laneflow.adapters.engine.local import LocalDrives, _backend

    ws = workspace(tmp_path)
    svc = services(tmp_path, 150)
    engine = local_engine(svc)
    ran: list[Any] = []

    class Recording:
        def __call__(self) -> Any:
            return self

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def drive(self, tenant: str, run_id: str) -> Any:
            result = engine.drive(tenant, run_id, tick_s=0.02)
            ran.append(result)
            return result

    run = create_run(svc, ws, "fan", {"items": [f"i{n}" for n in range(30)]})
    drives = LocalDrives(Recording(), pool=1)
    drives.start(run.tenant, run.id)
    drives.join(120)
    [result] = ran
    assert result.run.status == RunStatus.completed and len(result.executions) >= 2
    known = {e.execution_arn for m in _backend().state_machines for e in m.executions}
    assert not known & set(result.executions)


def test_rescues_larger_than_what_is_left_of_the_budget_run_in_later_executions_each_once(tmp_path: Path) -> None:
    # Given a fan-out of 20 that all fail, each with a rescue, and a budget of about 10 steps
    ws = workspace(tmp_path, stub="fail: cannot today")
    (ws / "agents" / "fixer").mkdir()
    (ws / "agents" / "fixer" / "agent.md").write_text('---\nstub: "Fixed {item}."\n---\nYou fix.\n')
    flow = (
        (ws / "flows" / "fan.yaml")
        .read_text()
        .replace("    instruction:", "    retries: 0\n    on_fail: fixer\n    instruction:")
    )
    (ws / "flows" / "fan.yaml").write_text(flow)
    svc = services(tmp_path, 200)
    engine = local_engine(svc)
    run = create_run(svc, ws, "fan", {"items": [f"i{n}" for n in range(20)]}, options={"gate": False})
    # When it is driven
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    # Then every failure was rescued, once, across several executions within their budget
    assert result.run.status == RunStatus.completed, result.run.error
    histories = assert_within_bounds(engine, result, 200)
    assert len(histories) >= 3
    rescues = [s for s in result.run.steps if s.rescue_of is not None]
    assert sorted(s.rescue_of for s in rescues) == list(range(20))  # type: ignore[type-var]
    assert all(s.status == StepStatus.completed for s in rescues)
    assert sum(entered(h, "RunRescue") for h in histories) == 20
    assert all(
        s.status == StepStatus.completed and s.result == f"Fixed i{s.index}." for s in result.run.steps if s.rescue_of is None
    )


def test_colleagues_in_a_lane_larger_than_the_budget_reach_each_other_across_its_windows(tmp_path: Path) -> None:
    """peers across the windows of a chunked lane: every scout messages the lane's last
    scout, which runs in a later execution than the first ones; it hears each of them in its
    next turn, and the messages of every window are in its record."""
    ws = workspace(
        tmp_path,
        stub='tool: peers_message {"to": 9, "text": "scout {item} covered {item}"}\nSent.\n===\nDone with {item}.',
    )
    agent = ws / "agents" / "worker" / "agent.md"
    agent.write_text(agent.read_text().replace("---\nstub:", "---\ntools: [peers]\nstub:", 1))
    svc = services(tmp_path, 120)
    run = create_run(svc, ws, "fan", {"items": [f"i{n}" for n in range(10)]})
    engine = local_engine(svc)
    result = engine.drive(run.tenant, run.id)
    assert_within_bounds(engine, result, 120)
    assert len(result.executions) >= 2
    final = svc.store.get_run(run.tenant, run.id, detail=True)
    assert final.status == RunStatus.completed, final.error
    last = final.steps[9]
    heard = [e.text for e in last.events if e.text.startswith("message from worker (step ")]
    # Those that ended before it started (the earlier windows' at least) were waiting for it;
    # one sent while it ran its last turn would be left unheard (the stub's turns are fixed).
    before = [s.index for s in final.steps[:9] if s.finished_at and last.started_at and s.finished_at < last.started_at]
    assert 0 in before
    assert {f"message from worker (step {n}): scout i{n} covered i{n}" for n in before} <= set(heard), heard
    first_window = [
        json.loads(e["stateEnteredEventDetails"]["input"])["step"]["index"]
        for e in RETIRED[id(engine)][result.executions[0]]
        if (e.get("stateEnteredEventDetails") or {}).get("name") == "WaitForLead"
    ]
    assert first_window and 9 not in first_window  # the listener ran in a later execution than these
