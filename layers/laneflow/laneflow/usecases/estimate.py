"""`laneflow estimate` and `POST /estimates`: what a run would cost and cache, before it runs.

The run is prepared exactly as `start_run` prepares it (the workspace, the flow, the input
checked against its schema, fan-outs expanded, each step's model resolved) and nothing is
written. Each lane's prefix is built the way the runner builds it: the agent's prompt layers
(`domain.prompt`) and the tool definitions its requests carry (`Services.tool_definitions`),
and looked up in the prefix registry under the key its steps register it by
(`job_prefix_key`, in the run's tenant). What the flow's previous completed run measured
(turns, output per call) is learned from the store. The arithmetic is `domain.estimate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from laneflow.domain.cache import min_cacheable, prefix_tokens, tokens_in, tokens_of
from laneflow.domain.errors import Unavailable
from laneflow.domain.estimate import (
    DEFAULT_MAX_TURNS,
    DEFAULT_OUTPUT_TOKENS,
    RANGE_RULE,
    Estimate,
    LaneFacts,
    StubAnswers,
    Usage,
    UsageKey,
    estimate_of,
    usage_of,
)
from laneflow.domain.flow import Flow, step_spec
from laneflow.domain.inbox import PEERS, Peer
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.placeholders import fill
from laneflow.domain.pricing import PriceCatalog, catalog
from laneflow.domain.prompt import SystemPrompt, build_system_prompt
from laneflow.domain.records import Run, RunStatus, Step
from laneflow.domain.stub_answers import BadHeader, StubAnswer, parse_answer, pick_answer
from laneflow.domain.workspace import Agent, Workspace, load_workspace
from laneflow.ports import Services, StepJob
from laneflow.usecases.run_step.cache_break import PREVIOUS_RUNS_LOOKED_AT, job_prefix_key
from laneflow.usecases.run_step.job import agent_fields
from laneflow.usecases.run_step.message import user_message
from laneflow.usecases.start_run import flow_agents, prepare_run, run_account
from laneflow.usecases.start_run_idempotent import RunOfAFlow


def _stub_answer(agent: Agent, step: Step, run: Run) -> StubAnswer | None:
    raw = pick_answer(agent.settings.stub, 0, f"Done: {step.instruction.splitlines()[0] if step.instruction else agent.name}")
    try:
        return parse_answer(fill(raw, item=step.item, run_input=run.input, has_item=step.item is not None))
    except BadHeader:
        return None


def _stub_output(answer: StubAnswer) -> int:
    chars = [len(t.text) + sum(len(c.tool) + len(c.input) for c in t.calls) for t in answer.turns]
    return sum(tokens_in(n) for n in chars)  # as the stub counts its output


def _stub_answers(agent: Agent, members: list[Step], run: Run) -> StubAnswers:
    """A stub lane's turns, output per turn and `cost:`, from the agent's own answers."""
    answers = [_stub_answer(agent, s, run) for s in members]
    turns = max(1, len(answers[0].turns)) if answers and answers[0] else 1
    output = sum(_stub_output(a) for a in answers if a) // max(1, len(members) * turns)
    return StubAnswers(turns=turns, output_tokens=output, cost_usd=sum(a.total_cost for a in answers if a))


def learned_usage(svc: Services, run: Run) -> tuple[str | None, dict[UsageKey, Usage]]:
    """What a step of each (agent, model) did in the flow's previous completed run of this
    tenant and workspace (`domain.estimate.usage_of`): (that run's id, {(entry, agent,
    model): usage}), or (None, {}) when the flow has no such run."""
    for other in svc.store.list_runs(run.tenant, limit=PREVIOUS_RUNS_LOOKED_AT, status=[RunStatus.completed]):
        if other.workspace != run.workspace or other.flow != run.flow:
            continue
        return other.id, usage_of(svc.store.get_run(run.tenant, other.id, detail=True).steps)
    return None, {}


class _Lanes:
    """The lanes of one prepared run, planned as the planner plans them, with what is known
    of each before it runs (`LaneFacts`)."""

    def __init__(
        self,
        svc: Services,
        run: Run,
        ws: Workspace,
        agents: Mapping[str, Agent],
        learned: Mapping[UsageKey, Usage] | None = None,
    ):
        self.svc, self.run, self.ws, self.agents = svc, run, ws, agents
        self.prompts: dict[str, SystemPrompt] = {name: build_system_prompt(ws, agent) for name, agent in agents.items()}
        self.learned = learned or {}
        self.used_learned = False  # a Claude lane assumed what the earlier run's calls did
        self.flow = Flow.model_validate(run.flow_spec)

    def _job(self, agent: Agent, prompt: SystemPrompt, model: str) -> StepJob:
        """A step's job as `attempt_job` makes it, as far as its prefix goes."""
        return StepJob(
            tenant=self.run.tenant,
            run_id=self.run.id,
            index=0,
            attempt=1,
            agent=agent.name,
            model=model,
            item=None,
            run_input=self.run.input,
            system_stable=prompt.stable,
            system_dynamic=prompt.dynamic,
            user="",
            workspace_root=self.run.workspace_uri,
            **agent_fields(agent),
        )

    def _learned(self, entry: int, agent: str, model: str) -> Usage | None:
        """What the earlier run measured of this entry's steps of the agent, else of any of its steps."""
        return self.learned.get((entry, agent, model)) or self.learned.get((None, agent, model))

    def _dynamic(self, agent: Agent, step: Step, group: list[Step]) -> str:
        """The step's dynamic layers (with its colleagues, for an agent with `peers`)."""
        if PEERS not in agent.settings.tools:
            return self.prompts[agent.name].dynamic
        peers = [
            Peer(agent=s.agent or "", index=s.index, item=s.item, status=s.status.value)
            for s in group
            if s.index != step.index and s.rescue_of is None and s.agent
        ]
        return build_system_prompt(self.ws, agent, peers=peers).dynamic

    def group(self, group: int, steps: list[Step]) -> list[LaneFacts]:
        lanes: list[LaneFacts] = []
        by_index = {s.index: s for s in steps}
        for lane in plan_lanes(steps, self.flow, self.svc.settings.max_lane_parallel, gate=True):
            members = [by_index[i] for i in [*lane.starters, *lane.siblings]]
            agent, prompt = self.agents[lane.agent], self.prompts[lane.agent]
            job = self._job(agent, prompt, lane.model)
            defs = self.svc.tool_definitions(job) if self.svc.tool_definitions else []
            key = job_prefix_key(job)
            stub = _stub_answers(agent, members, self.run) if lane.model == "stub" else None
            learned = None if stub else self._learned(members[0].entry, lane.agent, lane.model)
            self.used_learned |= learned is not None
            specs = [step_spec(self.run, s) for s in members]
            lanes.append(
                LaneFacts(
                    group=group,
                    agent=lane.agent,
                    model=lane.model,
                    steps=len(members),
                    parallel=lane.parallel,
                    prefix_tokens=prefix_tokens(prompt.stable, defs),
                    min_cacheable=min_cacheable(lane.model),
                    prefix_key=key,
                    inputs=tuple(
                        tokens_of(self._dynamic(agent, s, steps) + user_message(s, spec, "", []))
                        for s, spec in zip(members, specs, strict=True)
                    ),
                    takes_handoff=tuple(spec.handoff != "none" for spec in specs),
                    max_turns=agent.settings.max_turns or DEFAULT_MAX_TURNS,
                    has_tools=bool(defs or job.mcp),
                    stub=stub,
                    learned=learned,
                    registry=self.svc.store.get_prefix(self.run.tenant, key),
                )
            )
        return lanes


def estimate_run(
    svc: Services,
    workspace: str | Path,
    flow_name: str,
    run_input: Any = None,
    *,
    model: str | None = None,
    account: str | Path | None = None,
    output_tokens: int | None = None,
    prices: PriceCatalog | None = None,
    tenant: str | None = None,
    now: float | None = None,
) -> Estimate:
    """The estimate of a run of `flow_name` on `run_input` (`InvalidInput` as a run would
    refuse it), at `now` on the cache clock (default: `cache_now()`): a point and a range
    (`domain.estimate`). Each group's first cycle; rescues, retries and loops' later cycles
    are not counted. A Claude turn writes `output_tokens` when given; else a step does what a
    step of the same agent and model did in the flow's previous completed run (its turns, its
    output per call); else one turn of DEFAULT_OUTPUT_TOKENS."""
    run = prepare_run(svc, workspace, flow_name, run_input, tenant=tenant, model=model, account=account, check_models=False)
    ws = load_workspace(run.workspace_uri, run_account(run))
    agents = flow_agents(ws, Flow.model_validate(run.flow_spec))
    learned_from, learned = learned_usage(svc, run) if output_tokens is None else (None, {})
    lanes = _Lanes(svc, run, ws, agents, learned)
    groups = []
    for group in sorted({s.group for s in run.steps}):
        steps = [s for s in run.steps if s.group == group and s.agent]
        if steps:  # an approval has none
            groups.append(lanes.group(group, steps))
    result = estimate_of(
        run.workspace,
        run.flow,
        groups,
        prices or catalog(),
        output_tokens=DEFAULT_OUTPUT_TOKENS if output_tokens is None else output_tokens,
        now=svc.cache_now() if now is None else now,
    )
    result.learned_from = learned_from if lanes.used_learned else None
    return result


class EstimateRequest(RunOfAFlow):
    """`POST /estimates`: what a run of a flow of a workspace on an input would cache and cost."""

    output_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="output tokens a Claude turn is assumed to write (default: what the flow's previous completed run"
        f" measured per call of the same agent and model, with its turns, else {DEFAULT_OUTPUT_TOKENS} in one turn)",
    )


class EstimateAnswer(BaseModel):
    """What `POST /estimates` answers (and `laneflow estimate --json` prints)."""

    workspace: str
    flow: str
    output_tokens_per_turn: int = Field(description="the output a Claude turn was assumed to write where nothing was learned")
    output_learned_from: str | None = Field(
        description="the earlier run of the flow whose turns and output per call the Claude lanes assume (learned: true)"
    )
    lanes: list[dict[str, Any]] = Field(
        description="per lane: group, lane (agent@model), steps, parallel, turns, output_tokens_per_turn, learned, "
        "prefix_tokens, prefix_key (the prefix registry's), min_cacheable, cacheable, lead (reads | writes | uncached), "
        "lead_reads (why: 'warm now (run R)', 'being written now (run R)', 'written in group G of this run'), warm_now "
        "(the registry's record: run, since, until), with_gate / without_gate: cold_prefixes, cache_write, cache_read, "
        "input, output, cost_usd; range_usd: low, high"
    )
    totals: dict[str, Any] = Field(description="with_gate / without_gate: cold_prefixes, cache_write, cache_read, cost_usd")
    cost_usd: dict[str, float] = Field(description="expected (the point, with the gate), without_gate, low, high")
    range_rule: str = Field(description=f"how low and high are counted: {RANGE_RULE}")
    unpriced_models: list[str] = Field(description="models the price catalog has no price for (counted as $0)")


def estimate_request(svc: Services, tenant: str, request: EstimateRequest) -> dict[str, Any]:
    """The estimate of the tenant's own workspace's flow, as `laneflow estimate --json` prints it."""
    if svc.workspaces is None:
        raise Unavailable("this deployment has no workspaces to estimate runs of")
    uri = svc.workspaces.locate(tenant, request.workspace)  # the caller's own workspace, never another tenant's
    result = estimate_run(
        svc,
        svc.folders.open(uri),
        request.flow,
        request.input,
        model=request.model,
        output_tokens=request.output_tokens,
        tenant=tenant,
    )
    return result.as_dict()
