"""Sandbox tasks in the cloud: the Fargate tasks the state machine starts for sandboxed steps
(`ecs:runTask.waitForTaskToken`). The state machine runs them; laneflow only stops one (a
person stopped its run), asks whether one is still there (reconcile) and, once one stopped,
whether it stopped for memory or was evicted (`stopped_for`): its attempt's next one runs one
`size:` up (domain/sizes.py), in a task of that size's CPU and memory (`size_overrides`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from laneflow.adapters.aws.clients import LazyClient
from laneflow.domain.sizes import TASK_RESOURCES
from laneflow.domain.workers import FargateTask

if TYPE_CHECKING:
    from types_boto3_ecs import ECSClient  # noqa: F401 (named by the base class, a string)

log = logging.getLogger("laneflow.ecs")


def cluster_of(task_arn: str, cluster: str | None = None) -> str | None:
    """The cluster a task runs on: as its reference says, else from its ARN
    (`arn:aws:ecs:REGION:ACCOUNT:task/CLUSTER/ID`); None for the default cluster."""
    if cluster:
        return cluster
    parts = task_arn.split(":", 5)[-1].split("/")
    return parts[1] if len(parts) == 3 else None


# How ECS says a task was evicted: its stopCode (a Fargate Spot interruption, a retirement
# notice), or a stoppedReason naming its host going away. A container killed for memory says
# so in its own `reason` ("OutOfMemoryError: Container killed due to memory usage"), and a
# task whose memory ran out in its stoppedReason.
EVICTED_CODES = {"SpotInterruption": "a Fargate Spot interruption", "TerminationNotice": "a termination notice"}

EVICTED_REASONS = ("Host EC2", "Your Spot Task was interrupted", "Task is being retired", "scheduled for retirement")


def stopped_for(task: dict[str, Any]) -> str | None:
    """Why a STOPPED task (as DescribeTasks answers it) stopped, when it was for memory or an
    eviction: what the attempt's reason says; None for any other stop (or a running task)."""
    if task.get("lastStatus") != "STOPPED" and task.get("desiredStatus") != "STOPPED":
        return None
    said = str(task.get("stoppedReason") or "")
    for container in task.get("containers") or []:
        if "OutOfMemory" in str(container.get("reason") or ""):
            return f"its sandbox task was stopped for memory ({str(container['reason'])[:120]})"
    if "OutOfMemory" in said:
        return f"its sandbox task was stopped for memory ({said[:120]})"
    code = str(task.get("stopCode") or "")
    if code in EVICTED_CODES:
        return f"its sandbox task was evicted ({EVICTED_CODES[code]})"
    if any(marker in said for marker in EVICTED_REASONS):
        return f"its sandbox task was evicted ({said[:120]})"
    return None


def size_overrides(size: str) -> dict[str, str]:
    """The RunTask `overrides` (task-level `cpu` and `memory`) of a sandbox task for `size:`."""
    cpu, memory = TASK_RESOURCES.get(size, TASK_RESOURCES["medium"])
    return {"cpu": str(cpu), "memory": str(memory)}


class EcsTasks(LazyClient["ECSClient"]):
    """`SandboxTasks` through boto3's ECS client (made on first use)."""

    service = "ecs"

    def stop(self, task: FargateTask, reason: str) -> None:
        """StopTask: ECS sends the container SIGTERM, then SIGKILL after its stop timeout."""
        args = {"task": task.task, "reason": reason[:255]}
        if cluster := cluster_of(task.task, task.cluster):
            args["cluster"] = cluster
        self.client.stop_task(**args)

    def alive(self, task_arn: str, cluster: str | None = None) -> bool | None:
        """False once the task stopped (or ECS no longer knows it), True while it runs."""
        args: dict[str, Any] = {"tasks": [task_arn]}
        if name := cluster_of(task_arn, cluster):
            args["cluster"] = name
        out = self.client.describe_tasks(**args)
        tasks = out.get("tasks") or []
        if not tasks:
            return False if any(f.get("reason") == "MISSING" for f in out.get("failures", [])) else None
        return bool(tasks[0].get("lastStatus") != "STOPPED" and tasks[0].get("desiredStatus") != "STOPPED")

    def why_stopped(self, task_arn: str, cluster: str | None = None) -> str | None:
        """`stopped_for` of the task as ECS describes it now."""
        args: dict[str, Any] = {"tasks": [task_arn]}
        if name := cluster_of(task_arn, cluster):
            args["cluster"] = name
        tasks = self.client.describe_tasks(**args).get("tasks") or []
        return stopped_for(dict(tasks[0])) if tasks else None


def task_alive(tasks: EcsTasks | None = None) -> Callable[[str], bool | None]:
    """ECS's answer to "is this sandbox task still there?" (reconcile's liveness)."""
    ecs = tasks or EcsTasks()

    def alive(task_arn: str) -> bool | None:
        try:
            return ecs.alive(task_arn)
        except Exception as error:  # cannot tell: reconcile leaves the attempt alone
            log.warning("could not describe sandbox task %s: %s", task_arn, error)
            return None

    return alive


def task_gone_for(tasks: EcsTasks | None = None) -> Callable[[str], str | None]:
    """ECS's answer to "did this sandbox task stop for memory, or was it evicted?" (reconcile's
    reason for its attempt's interruption)."""
    ecs = tasks or EcsTasks()

    def why(task_arn: str) -> str | None:
        try:
            return ecs.why_stopped(task_arn)
        except Exception as error:  # cannot tell: the interruption's reason stays the plain one
            log.warning("could not describe sandbox task %s: %s", task_arn, error)
            return None

    return why
