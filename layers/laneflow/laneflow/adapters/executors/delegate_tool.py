"""The `delegate` tool (agent.md `delegates:`): `delegate {"agent": NAME, "task": TEXT}` runs
the named agent's own model loop inside this step's attempt, through the sink's `Delegator`
(laneflow.usecases.run_step.delegation), and returns its final reply."""

from __future__ import annotations

from typing import Any

from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.delegation import DELEGATE, MAX_DEPTH, DelegationRefused
from laneflow.ports import ExecutionSink, StepJob

MAX_TASK_CHARS = 100_000


class DelegateTool:
    """The `delegate` tool of one attempt, when its agent has `delegates:`."""

    def __init__(self, job: StepJob, sink: ExecutionSink):
        self.delegates = tuple(job.delegates)
        self.sink = sink

    @property
    def names(self) -> list[str]:
        return [DELEGATE] if self.delegates else []

    def definitions(self) -> list[dict[str, Any]]:
        if not self.delegates:
            return []
        return [
            {
                "name": DELEGATE,
                "description": (
                    "Hand a task to a colleague agent: it works on it with its own instructions and tools and its final "
                    f"reply is this tool's result. Say everything it needs in the task. Delegation is at most {MAX_DEPTH} deep."
                ),
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "agent": {"type": "string", "enum": list(self.delegates), "description": "who does the task"},
                        "task": {"type": "string", "description": "the task, whole: the colleague sees nothing else of yours"},
                    },
                    "required": ["agent", "task"],
                },
            }
        ]

    def run(self, args: dict[str, Any]) -> str:
        agent, task = args.get("agent"), args.get("task")
        if not isinstance(agent, str) or not agent:
            raise ToolError('delegate takes {"agent": NAME, "task": TEXT}: agent must be a non-empty string')
        if not isinstance(task, str) or not task.strip():
            raise ToolError('delegate takes {"agent": NAME, "task": TEXT}: task must be a non-empty string')
        if len(task) > MAX_TASK_CHARS or "\x00" in task:
            raise ToolError(f"delegate: a task is at most {MAX_TASK_CHARS:,} characters of text")
        delegator = getattr(self.sink, "delegator", None)
        if delegator is None:
            raise ToolError("delegate: this step cannot delegate here (no delegator)")
        try:
            return str(delegator.delegate(agent, task))
        except DelegationRefused as refused:
            raise ToolError(f"delegate: {refused}") from None
