"""A sandbox task stopped for memory, or evicted, under moto: how ECS says so is read as a
memory kill (`stopped_for`), reconcile ends its attempt interrupted with that reason and the
kind `memory`, and the drive that runs the step again starts its RunTask one `size:` up (the
task's cpu and memory overrides), where the worker runs the attempt at that size and says so."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from integration.test_sandbox_cloud import aws, fargate_environment  # noqa: F401 (aws: the fixture)

from laneflow.adapters.aws.ecs import EcsTasks, stopped_for, task_alive, task_gone_for
from laneflow.adapters.engine.local import LocalEngine
from laneflow.adapters.workers import Liveness
from laneflow.domain.messages import DriveRef, LaneStep, StepCrashedRequest
from laneflow.domain.records import AttemptStatus, FailureKind, RunStatus, StepStatus, utcnow
from laneflow.domain.sizes import task_overrides
from laneflow.domain.workers import FargateTask
from laneflow.entrypoints import sandbox_worker
from laneflow.usecases.reconcile import Reconciler
from laneflow.usecases.start_run import create_run
from laneflow.usecases.step_crashed import step_crashed
from laneflow.wiring import bound

TENANT = "123456789012"

OOM = "OutOfMemoryError: Container killed due to memory usage"


def stopped(**fields: Any) -> dict[str, Any]:
    return {"lastStatus": "STOPPED", "desiredStatus": "STOPPED", **fields}


def test_how_ecs_says_a_task_stopped_for_memory_or_was_evicted_is_read_as_such() -> None:
    container_oom = stopped(stopCode="EssentialContainerExited", containers=[{"name": "step", "exitCode": 137, "reason": OOM}])
    assert stopped_for(container_oom) == f"its sandbox task was stopped for memory ({OOM})"
    assert stopped_for(stopped(stoppedReason=OOM)) == f"its sandbox task was stopped for memory ({OOM})"
    spot = stopped(stopCode="SpotInterruption", stoppedReason="Your Spot Task was interrupted.")
    assert stopped_for(spot) == "its sandbox task was evicted (a Fargate Spot interruption)"
    assert stopped_for(stopped(stoppedReason="Host EC2 (instance i-0abc) terminated.")) == (
        "its sandbox task was evicted (Host EC2 (instance i-0abc) terminated.)"
    )
    # Any other stop is a worker gone, as before: a person's stop, a worker that exited, a running task.
    assert stopped_for(stopped(stopCode="UserInitiated", stoppedReason="run stopped by a person")) is None
    assert stopped_for(stopped(stopCode="EssentialContainerExited", containers=[{"exitCode": 1}])) is None
    assert stopped_for({"lastStatus": "RUNNING", "desiredStatus": "RUNNING", "stoppedReason": OOM}) is None


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws-cloud-size-up"
    (ws / "agents" / "builder").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "agents" / "builder" / "agent.md").write_text('---\nsize: small\ntools: [bash]\nstub: "built"\n---\nYou build.\n')
    (ws / "flows" / "build.yaml").write_text("steps:\n  - agent: builder\n    retries: 0\n    instruction: Build.\n")
    return ws


def run_task(aws: dict[str, Any], size: str) -> str:  # noqa: F811 (the fixture's value)
    subs = aws["subs"]
    arn: str = aws["ecs"].run_task(
        cluster=aws["cluster"],
        taskDefinition=subs["SandboxTaskDefinitionArn"],
        launchType="FARGATE",
        overrides=task_overrides(size),
        networkConfiguration={
            "awsvpcConfiguration": {"subnets": [subs["SandboxSubnets"]], "securityGroups": [subs["SandboxSecurityGroups"]]}
        },
    )["tasks"][0]["taskArn"]
    return arn


@pytest.mark.parametrize("stop", [OOM, "Your Spot Task was interrupted."])
def test_a_task_stopped_for_memory_is_interrupted_as_such_and_the_step_runs_again_in_a_larger_task(
    aws: dict[str, Any],  # noqa: F811 (the fixture)
    tmp_path: Path,
    stop: str,
) -> None:
    svc, ecs = aws["svc"], aws["ecs"]
    run = create_run(svc, workspace(tmp_path), "build", {}, tenant=TENANT)
    assert run.options["sizes"] == {"builder": "small"}  # fixed as the run starts, as its sandboxed agents are
    # Its first attempt ran in a small task (0.5 vCPU, 1 GiB), which ECS stopped.
    task = run_task(aws, "small")
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 32, started_at=utcnow(), worker=FargateTask(task=task))
    ecs.stop_task(cluster=aws["cluster"], task=task, reason=stop)
    tasks = EcsTasks(client=ecs)
    report = Reconciler(svc, Liveness(task_alive=task_alive(tasks), task_gone_for=task_gone_for(tasks))).run()
    assert [a.outcome for a in report.attempts] == ["interrupted"]
    (first,) = svc.store.list_attempts(run.tenant, run.id)
    why = "stopped for memory" if stop == OOM else "evicted"
    assert first.status == AttemptStatus.interrupted and first.reason_kind == FailureKind.memory
    assert first.reason is not None and first.reason.startswith(f"interrupted: its sandbox task was {why}"), first.reason
    # The drive that runs it again starts its task one size up: medium's 1 vCPU and 4 GiB.
    engine = LocalEngine(svc, bind=bound, local_sandboxes=False, substitutions=aws["subs"])
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", engine.drive(run.tenant, run.id, tick_s=0.02)), daemon=True)
    thread.start()
    again = the_task_after(aws, task)
    assert again["overrides"]["cpu"] == "1024" and again["overrides"]["memory"] == "4096", again["overrides"]
    assert sandbox_worker.run(fargate_environment(again)) == 0  # the test is the Fargate task
    thread.join(60)
    assert out["result"].execution_status == "SUCCEEDED", (out["result"].error, out["result"].cause)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.completed and final.steps[0].status == StepStatus.completed
    assert [a.status for a in svc.store.list_attempts(run.tenant, run.id)] == [AttemptStatus.interrupted, AttemptStatus.completed]
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    [up] = [e for e in step.events if e.text.startswith("size ")]
    assert up.attempt == 2 and up.text.startswith("size medium, up from small after "), up.text
    [fence] = [e for e in step.events if e.text.startswith("isolation: ")]
    assert "2 GiB of memory" in fence.text, fence.text


def crashed(run: Any, *, size_up: bool = True) -> StepCrashedRequest:
    return StepCrashedRequest(
        run=DriveRef(tenant=run.tenant, run_id=run.id),
        step=LaneStep(index=0),
        error={"Error": "States.HeartbeatTimeout"},
        size_up=size_up,
    )


def test_a_heartbeat_timeout_of_a_task_stopped_for_memory_runs_the_step_again_one_size_up(
    aws: dict[str, Any],  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    svc, ecs = aws["svc"], aws["ecs"]
    svc.tasks = EcsTasks(client=ecs)
    run = create_run(svc, workspace(tmp_path), "build", {}, tenant=TENANT)
    task = run_task(aws, "small")
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 32, started_at=utcnow(), worker=FargateTask(task=task))
    ecs.stop_task(cluster=aws["cluster"], task=task, reason=OOM)
    report = step_crashed(svc, crashed(run))
    # The step is pending again, and the Catch is told to start it in a medium task.
    assert report.status == StepStatus.pending and report.again and report.task == task_overrides("medium"), report
    (attempt,) = svc.store.list_attempts(run.tenant, run.id)
    assert attempt.status == AttemptStatus.failed and attempt.reason_kind == FailureKind.memory
    assert attempt.reason == (
        f"the step's worker failed (States.HeartbeatTimeout); its sandbox task was stopped for memory ({OOM});"
        " the next attempt runs at size medium"
    )
    assert svc.store.get_step(run.tenant, run.id, 0).status == StepStatus.pending
    # Its next attempt, stopped for memory at medium, goes to large; stopped at large, the step fails.
    sizes = []
    for n in (2, 3):
        task = run_task(aws, "small")
        svc.store.claim_attempt(run.tenant, run.id, 0, token=str(n) * 32, started_at=utcnow(), worker=FargateTask(task=task))
        ecs.stop_task(cluster=aws["cluster"], task=task, reason=OOM)
        report = step_crashed(svc, crashed(run))
        sizes.append((report.status, report.again, report.task))
    assert sizes[0] == (StepStatus.pending, True, task_overrides("large"))
    assert sizes[1][:2] == (StepStatus.failed, False), sizes
    last = svc.store.list_attempts(run.tenant, run.id)[-1]
    assert last.status == AttemptStatus.failed and last.reason_kind == FailureKind.memory
    assert "the next attempt" not in (last.reason or "")


@pytest.mark.parametrize("why", ["a worker that exited", "not a sandbox's catch"])
def test_a_crash_not_for_memory_or_outside_a_sandbox_state_fails_the_step_as_before(
    aws: dict[str, Any],  # noqa: F811 (the fixture)
    tmp_path: Path,
    why: str,
) -> None:
    svc, ecs = aws["svc"], aws["ecs"]
    svc.tasks = EcsTasks(client=ecs)
    run = create_run(svc, workspace(tmp_path), "build", {}, tenant=TENANT)
    task = run_task(aws, "small")
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 32, started_at=utcnow(), worker=FargateTask(task=task))
    ecs.stop_task(
        cluster=aws["cluster"], task=task, reason=OOM if why == "not a sandbox's catch" else "Essential container exited"
    )
    report = step_crashed(svc, crashed(run, size_up=why != "not a sandbox's catch"))
    assert report.status == StepStatus.failed and not report.again, report
    (attempt,) = svc.store.list_attempts(run.tenant, run.id)
    assert attempt.status == AttemptStatus.failed
    assert attempt.reason_kind == (FailureKind.worker if why == "a worker that exited" else FailureKind.memory)


def the_task_after(aws: dict[str, Any], earlier: str) -> dict[str, Any]:  # noqa: F811 (the fixture's value)
    """The task the drive started (the first that is not `earlier`)."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        arns = [a for a in aws["ecs"].list_tasks(cluster=aws["cluster"])["taskArns"] if a != earlier]
        if arns:
            answer: dict[str, Any] = aws["ecs"].describe_tasks(cluster=aws["cluster"], tasks=arns)["tasks"][0]
            return answer
        time.sleep(0.05)
    raise AssertionError("the sandbox state started no task")


def test_within_its_execution_a_task_stopped_for_memory_runs_the_step_again_in_a_larger_task(
    aws: dict[str, Any],  # noqa: F811 (the fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc, ecs = aws["svc"], aws["ecs"]
    svc.tasks = EcsTasks(client=ecs)
    run = create_run(svc, workspace(tmp_path), "build", {}, tenant=TENANT)
    engine = LocalEngine(svc, bind=bound, local_sandboxes=False, substitutions=aws["subs"])
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", engine.drive(run.tenant, run.id, tick_s=0.02)), daemon=True)
    thread.start()
    first = the_task_after(aws, "")
    assert first["overrides"]["memory"] == "1024", first["overrides"]  # small

    def killed(svc: Any, req: Any, worker: Any) -> None:
        """The first worker claims its attempt, then its task is stopped for memory: its
        failure reaches the state's Catch (as a heartbeat timeout would), not reconcile."""
        op_id = req.op.op_id(group=req.group, cycle=req.cycle, index=req.step.index)
        svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 32, started_at=utcnow(), op_id=op_id, worker=worker)
        ecs.stop_task(cluster=aws["cluster"], task=first["taskArn"], reason=OOM)
        raise RuntimeError("the task was stopped")

    with monkeypatch.context() as patched:
        patched.setattr("laneflow.usecases.run_step.runner.run_step", killed)
        assert sandbox_worker.run(fargate_environment(first)) == 0
    again = the_task_after(aws, first["taskArn"])
    assert again["overrides"]["cpu"] == "1024" and again["overrides"]["memory"] == "4096", again["overrides"]  # medium
    env = {e["name"]: e["value"] for e in again["overrides"]["containerOverrides"][0]["environment"]}
    assert env["LANEFLOW_OP_STATE"] == "SandboxStarter@4096"  # another operation than the first turn's
    assert sandbox_worker.run(fargate_environment(again)) == 0
    thread.join(60)
    assert out["result"].execution_status == "SUCCEEDED", (out["result"].error, out["result"].cause)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.completed and final.steps[0].status == StepStatus.completed
    attempts = svc.store.list_attempts(run.tenant, run.id)
    assert [(a.status, a.reason_kind) for a in attempts] == [
        (AttemptStatus.failed, FailureKind.memory),
        (AttemptStatus.completed, None),
    ], attempts
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    [up] = [e for e in step.events if e.text.startswith("size ")]
    assert up.attempt == 2 and up.text.startswith("size medium, up from small after "), up.text
