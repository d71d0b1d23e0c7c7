"""What an attempt hands its executor (`StepJob`): the step's prompt and message, and its
agent's settings as this attempt reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from laneflow.domain.records import Run, Step
from laneflow.domain.workspace import Agent
from laneflow.ports import Services, StepJob

if TYPE_CHECKING:
    from laneflow.usecases.run_step.runner import PreparedAttempt


def agent_fields(agent: Agent) -> dict[str, Any]:
    """What a job takes from its agent's settings as read now (a step's agent, or a
    delegate's): its tools and how they reach, its answers and its limits."""
    settings = agent.settings
    return {
        "tools": tuple(settings.tools),
        "agent_path": agent.path,
        "stub": settings.stub,
        "max_turns": settings.max_turns,
        "timeout": settings.timeout,
        "effort": settings.effort,
        "apis": tuple(agent.apis),
        "network": tuple(agent.network),
        "delegates": tuple(settings.delegates),
        "web_max_uses": settings.web_max_uses,
        "mcp": tuple(agent.mcp),
    }


def attempt_job(
    svc: Services,
    run: Run,
    step: Step,
    prepared: PreparedAttempt,
    *,
    user: str,
    attempt: int,
    budget: float | None,
    size: str | None,
    secret_env: dict[str, str],
) -> StepJob:
    """The job of attempt `attempt` of `step`: `budget` is what is left of the step's, `size`
    its programs' size (one up after a memory kill), `secret_env` its declared secrets."""
    ws, agent, prompt = prepared.workspace, prepared.agent, prepared.prompt
    return StepJob(
        tenant=run.tenant,
        run_id=run.id,
        index=step.index,
        attempt=attempt,
        agent=agent.name,
        model=step.model,
        item=step.item,
        run_input=svc.store.get_run_input(run.tenant, run.id),
        system_stable=prompt.stable,
        system_dynamic=prompt.dynamic,
        user=user,
        workspace_root=str(ws.root),
        answer_index=attempt - 1,
        budget=budget,
        size=size,
        network_enforce=bool(ws.settings.network_enforce),
        # In a sandbox worker also when only a delegate runs programs: its MCP servers are fenced too.
        sandboxed=agent.sandboxed or svc.sandbox,
        secret_env=secret_env,
        **agent_fields(agent),
    )
