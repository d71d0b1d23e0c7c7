"""Starting a run: everything is checked before anything is written.

`prepare_run` reads the workspace and the flow, validates the input against the flow's
`input:` schema, resolves each step's model and expands `each:` fan-outs into steps. Only a
run that passed all of that is written, whole, by `create_run`.
"""

from __future__ import annotations

import datetime as _dt
import secrets as _secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from laneflow.domain import jsonsafe
from laneflow.domain.cache_ttl import CACHE_TTL_OPTION
from laneflow.domain.delegation import DELEGATES, reach, reach_options
from laneflow.domain.flow import Flow, StepSpec, load_flow, validate_input
from laneflow.domain.lanes import SANDBOXED
from laneflow.domain.placeholders import fill, lookup_input
from laneflow.domain.records import Run, Step
from laneflow.domain.sizes import SIZES_OPTION
from laneflow.domain.workspace import (
    Agent,
    Workspace,
    load_agent,
    load_workspace,
    workspace_revision,
)
from laneflow.ports import Services
from laneflow.usecases.cache_ttl import run_ttl_signals
from laneflow.usecases.masking import RUN_SECRETS, masking, secret_names


def new_run_id(now: _dt.datetime | None = None) -> str:
    """`run-YYYYMMDD-HHMMSS-xxxxxx`: sortable by creation, unique by its random tail."""
    now = now or _dt.datetime.now(_dt.UTC)
    return f"run-{now.strftime('%Y%m%d-%H%M%S')}-{_secrets.token_hex(3)}"


def each_items(spec: StepSpec, run_input: Any) -> list[Any] | None:
    """The fan-out items of an `each:` step (None when it has no `each:`)."""
    if spec.each is None:
        return None
    if isinstance(spec.each, list):
        return list(spec.each)
    found, value = lookup_input(run_input, spec.each)
    # validate_input has already refused a missing or non-list NAME.
    return list(value) if found and isinstance(value, list) else []


def resolve_model(spec: StepSpec, agent_model: str | None, ws: Workspace, *, override: str | None, default: str) -> str:
    """`--model` for the run, else the step's `model:`, the agent's, the workspace's, the default."""
    return override or spec.model or agent_model or ws.settings.model or default


def expand_steps(
    flow: Flow, ws: Workspace, agents: Mapping[str, Agent], run_input: Any, *, override: str | None, default_model: str
) -> list[Step]:
    """One step record per step of the flow, fan-outs expanded, in group order (`agents`:
    the flow's agents, read once: `flow_agents`)."""
    steps: list[Step] = []
    for group, entry in enumerate(flow.entries):
        if entry.kind == "approval":
            steps.append(Step(index=len(steps), group=group, entry=entry.index, agent=None, instruction=entry.approval or ""))
            continue
        for slot, spec in enumerate(entry.steps):
            model = resolve_model(spec, agents[spec.agent].settings.model, ws, override=override, default=default_model)
            items = each_items(spec, run_input)
            for item in items if items is not None else [None]:
                steps.append(
                    Step(
                        index=len(steps),
                        group=group,
                        entry=entry.index,
                        slot=slot,
                        agent=spec.agent,
                        item=item,
                        model=model,
                        optional=spec.optional,
                        instruction=fill(spec.instruction, item=item, run_input=run_input, has_item=items is not None),
                    )
                )
    return steps


def prepare_run(
    svc: Services,
    workspace: str | Path,
    flow_name: str,
    run_input: Any = None,
    *,
    tenant: str | None = None,
    model: str | None = None,
    account: str | Path | None = None,
    options: dict[str, Any] | None = None,
    check_models: bool = True,
) -> Run:
    """Read, check and expand everything a run needs; raise `InvalidInput` (listing every
    problem) before anything is written. (`check_models=False`: an estimate, which calls no
    model, needs no model's key.)"""
    run_input = {} if run_input is None else run_input
    # Whatever the caller read it with: a value the store cannot keep is refused here too.
    jsonsafe.check(run_input, "input")
    ws = load_workspace(workspace, account)
    flow = load_flow(ws, flow_name)
    validate_input(flow, run_input)
    agents = flow_agents(ws, flow)
    steps = expand_steps(flow, ws, agents, run_input, override=model, default_model=svc.settings.default_model)
    for used in sorted({s.model for s in steps if s.agent}) if check_models else []:
        svc.check_model(used)  # a model without what it needs: ModelNotConfigured, before anything is written
    options = dict(options or {})
    if account is not None:
        # Every attempt reads the workspace afresh (also on a retry, a resume, a re-drive):
        # the account it was started with is kept on the run so each reads it the same way.
        options["account"] = str(Path(account).expanduser().resolve())
    # Which agents run in a sandbox worker is fixed as the run starts, so the planner routes
    # their lanes without reading agents (a step's own worker still reads its agent afresh,
    # and refuses a sandboxed agent outside a sandbox: StepRunner).
    # A step is sandboxed when any agent it may delegate to runs programs; what each reaches
    # is fixed too (those agents' folders join its scratch copy).
    reaches = reach_options({name: agent.settings.delegates for name, agent in agents.items()})
    options[SANDBOXED] = sorted(
        name for name, agent in agents.items() if agent.sandboxed or any(agents[d].sandboxed for d in reaches.get(name, ()))
    )
    if reaches:
        options[DELEGATES] = reaches
    # And their `size:`, which sizes their sandbox tasks in the cloud (domain/sizes.py).
    if sizes := {name: agent.settings.size for name, agent in sorted(agents.items()) if agent.sandboxed and agent.settings.size}:
        options[SIZES_OPTION] = sizes
    # Every name the flow's agents declare is fixed too: each record of the run is masked with
    # all of their values, whichever step it is (usecases.masking).
    options[RUN_SECRETS] = secret_names(agents)
    budget = flow.budget or ws.settings.budget
    if budget:
        options.setdefault("budget", budget)  # the run's budget is fixed as it starts
    run = Run(
        id=new_run_id(),
        tenant=tenant or svc.settings.tenant,
        workspace=ws.name,
        flow=flow.name,
        input=run_input,
        model=model,
        options=options,
        revision=workspace_revision(ws.root),
        workspace_uri=str(Path(ws.root).resolve()),
        flow_spec=flow.model_dump(mode="json", by_alias=True),
        steps=steps,
    )
    # Each agent's `cache_ttl` and when its prefix is expected to be read again (its lanes'
    # later waves, its loop, an approval, the flow's last starts) are fixed as it starts, so a
    # step chooses its TTL without reading other runs (usecases/cache_ttl.py).
    run.options[CACHE_TTL_OPTION] = run_ttl_signals(svc, run, flow, ws, agents)
    return run


def flow_agents(ws: Workspace, flow: Flow) -> dict[str, Agent]:
    """The flow's agents (its steps' and their rescues'), each read once, in flow order, then
    the agents they may reach by delegating."""
    names = [spec.agent for entry in flow.entries for spec in entry.steps]
    names += [spec.on_fail for entry in flow.entries for spec in entry.steps if spec.on_fail]
    agents = {name: load_agent(ws, name) for name in dict.fromkeys(names)}

    def delegates_of(name: str) -> list[str]:
        if name not in agents:
            agents[name] = load_agent(ws, name)
        return agents[name].settings.delegates

    done: set[str] = set()
    while todo := [name for name in agents if name not in done]:  # what each reaches, itself read too
        for name in todo:
            reach(name, delegates_of)
            done.add(name)
    return agents


def run_account(run: Run) -> str | None:
    """The account folder (or AGENTS.md) the run was started with (`--account`), if any:
    what every reload of its workspace passes along."""
    account = run.options.get("account")
    return str(account) if account else None


def create_run(svc: Services, workspace: str | Path, flow_name: str, run_input: Any = None, **kwargs: Any) -> Run:
    """Check and write a new `queued` run with all of its steps `pending`."""
    run = prepare_run(svc, workspace, flow_name, run_input, **kwargs)
    with masking(svc, run, strict=True):  # its input, instructions and flow are masked as they are first written
        svc.store.create_run(run)
    return run
