"""Sandbox tasks in the cloud: the Fargate tasks the state machine starts for sandboxed steps
(`ecs:runTask.waitForTaskToken`). The state machine runs them; laneflow only stops one (a
person stopped its run) and asks whether one is still there (reconcile)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from laneflow.adapters.aws.clients import LazyClient
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
