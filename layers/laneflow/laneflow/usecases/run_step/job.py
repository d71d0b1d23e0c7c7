"""What an attempt hands its executor (`StepJob`): the step's prompt and message, and its
agent's settings as this attempt reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from laneflow.domain.records import Run, Step
from laneflow.ports import Services, StepJob

if TYPE_CHECKING:
    from laneflow.usecases.run_step.runner import PreparedAttempt


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
        tools=tuple(agent.settings.tools),
        workspace_root=str(ws.root),
        agent_path=agent.path,
        stub=agent.settings.stub,
        answer_index=attempt - 1,
        max_turns=agent.settings.max_turns,
        timeout=agent.settings.timeout,
        budget=budget,
        effort=agent.settings.effort,
        size=size,
        network_enforce=bool(ws.settings.network_enforce),
        # In a sandbox worker also when only a delegate runs programs: its MCP servers are fenced too.
        sandboxed=agent.sandboxed or svc.sandbox,
        secret_env=secret_env,
        apis=tuple(agent.apis),
        network=tuple(agent.network),
        delegates=tuple(agent.settings.delegates),
        web_max_uses=agent.settings.web_max_uses,
        mcp=tuple(agent.mcp),
    )
