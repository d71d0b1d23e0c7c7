"""`laneflow estimate` and `POST /estimates`: what a run would cost and cache, before it runs.

The run is prepared exactly as `start_run` prepares it (the workspace, the flow, the input
checked against its schema, fan-outs expanded, each step's model resolved) and nothing is
written. Each lane's prefix is built the way the runner builds it: the agent's prompt layers
(`domain.prompt`) and the tool definitions its requests carry (`Services.tool_definitions`).
The arithmetic is `domain.estimate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from laneflow.domain.cache import min_cacheable, prefix_tokens, tokens_in, tokens_of
from laneflow.domain.errors import Unavailable
from laneflow.domain.estimate import DEFAULT_OUTPUT_TOKENS, Estimate, LaneEstimate, LanePlan, cache_figures
from laneflow.domain.flow import Flow, step_spec
from laneflow.domain.lanes import plan_lanes
from laneflow.domain.placeholders import fill
from laneflow.domain.pricing import PriceCatalog, catalog
from laneflow.domain.prompt import SystemPrompt, build_system_prompt
from laneflow.domain.records import Run, RunStatus, Step, Tokens
from laneflow.domain.stub_answers import BadHeader, StubAnswer, parse_answer, pick_answer
from laneflow.domain.workspace import Agent, load_workspace
from laneflow.ports import Services, StepJob
from laneflow.usecases.run_step.cache_break import PREVIOUS_RUNS_LOOKED_AT
from laneflow.usecases.run_step.message import user_message
from laneflow.usecases.start_run import flow_agents, prepare_run, run_account
from laneflow.usecases.start_run_idempotent import RunOfAFlow

HANDOFF_HEADER_TOKENS = 8  # "## Handoff from the previous group" and each step's "### agent — item (step N)"


def _stub_answer(agent: Agent, step: Step, run: Run) -> StubAnswer | None:
    raw = pick_answer(agent.settings.stub, 0, f"Done: {step.instruction.splitlines()[0] if step.instruction else agent.name}")
    try:
        return parse_answer(fill(raw, item=step.item, run_input=run.input, has_item=step.item is not None))
    except BadHeader:
        return None


def _stub_output(answer: StubAnswer) -> int:
    chars = [len(t.text) + sum(len(c.tool) + len(c.input) for c in t.calls) for t in answer.turns]
    return sum(tokens_in(n) for n in chars)  # as the stub counts its output


def learned_output(svc: Services, run: Run) -> tuple[str | None, dict[tuple[str, str], int]]:
    """The output a call of each (agent, model) wrote in the flow's previous completed run of
    this tenant and workspace, on average: (that run's id, {(agent, model): tokens}), or
    (None, {}) when the flow has no such run."""
    for other in svc.store.list_runs(run.tenant, limit=PREVIOUS_RUNS_LOOKED_AT, status=[RunStatus.completed]):
        if other.workspace != run.workspace or other.flow != run.flow:
            continue
        outputs: dict[tuple[str, str], list[int]] = {}
        for step in svc.store.get_run(run.tenant, other.id, detail=True).steps:
            for call in step.calls:
                outputs.setdefault((step.agent or "", step.model), []).append(call.tokens.output)
        return other.id, {key: sum(v) // len(v) for key, v in outputs.items() if v}
    return None, {}


class _Lanes:
    """The lanes of one prepared run, planned as the planner plans them."""

    def __init__(
        self,
        svc: Services,
        run: Run,
        agents: Mapping[str, Agent],
        prompts: Mapping[str, SystemPrompt],
        output_tokens: int,
        learned: Mapping[tuple[str, str], int] | None = None,
    ):
        self.svc, self.run, self.agents, self.prompts, self.output_tokens = svc, run, agents, prompts, output_tokens
        self.learned = learned or {}
        self.used_learned = False  # a Claude lane assumed what the earlier run's calls wrote
        self.flow = Flow.model_validate(run.flow_spec)
        self.handoff_tokens = 0  # what the previous group hands on, in tokens

    def _prefix(self, agent: Agent, prompt: SystemPrompt, model: str) -> int:
        job = StepJob(
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
            tools=tuple(agent.settings.tools),
            workspace_root=self.run.workspace_uri,
            agent_path=agent.path,
        )
        defs = self.svc.tool_definitions(job) if self.svc.tool_definitions else []
        return prefix_tokens(prompt.stable, defs)

    def group(self, group: int, steps: list[Step]) -> list[LanePlan]:
        plans: list[LanePlan] = []
        handed_on = 0
        by_index = {s.index: s for s in steps}
        for lane in plan_lanes(steps, self.flow, self.svc.settings.max_lane_parallel, gate=True):
            members = [by_index[i] for i in [*lane.starters, *lane.siblings]]
            agent, prompt = self.agents[lane.agent], self.prompts[lane.agent]
            stub = lane.model == "stub"
            answers = [_stub_answer(agent, s, self.run) for s in members] if stub else []
            turns = max(1, len(answers[0].turns)) if answers and answers[0] else 1
            if stub:
                output = sum(_stub_output(a) for a in answers if a) // max(1, len(members) * turns)
            else:
                output = self.learned.get((lane.agent, lane.model), self.output_tokens)
                self.used_learned |= (lane.agent, lane.model) in self.learned
            inputs = []
            for s in members:
                spec = step_spec(self.run, s)
                message = user_message(s, spec, "", [])
                handoff = self.handoff_tokens if spec.handoff != "none" else 0
                inputs.append(tokens_of(prompt.dynamic + message) + handoff)
            plans.append(
                LanePlan(
                    group=group,
                    agent=lane.agent,
                    model=lane.model,
                    steps=len(members),
                    parallel=lane.parallel,
                    prefix_tokens=self._prefix(agent, prompt, lane.model),
                    min_cacheable=min_cacheable(lane.model),
                    turns=turns,
                    input_tokens=sum(inputs) // max(1, len(inputs)),
                    output_tokens=output,
                    stub_cost_usd=sum(a.total_cost for a in answers if a) if stub else None,
                )
            )
            handed_on += len(members) * (turns * output + HANDOFF_HEADER_TOKENS)
        self.handoff_tokens = handed_on + HANDOFF_HEADER_TOKENS if handed_on else 0
        return plans


def _priced(plan: LanePlan, prices: PriceCatalog, unpriced: list[str], *, gate: bool, output_scale: float = 1.0) -> float:
    if plan.stub_cost_usd is not None:
        return plan.stub_cost_usd
    price = prices.price(plan.model)
    if price is None:
        if plan.model not in unpriced:
            unpriced.append(plan.model)
        return 0.0
    f = cache_figures(plan, gate=gate)
    tokens = Tokens(input=f.input, output=int(f.output * output_scale), cache_read=f.cache_read, cache_write=f.cache_write)
    return price.cost(tokens)


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
) -> Estimate:
    """The estimate of a run of `flow_name` on `run_input` (`InvalidInput` as a run would
    refuse it). Each group's first cycle; rescues and loops' later cycles are not counted.
    The output of a Claude turn is `output_tokens` when given; else what a call of the same
    agent and model wrote in the flow's previous completed run, else DEFAULT_OUTPUT_TOKENS."""
    run = prepare_run(svc, workspace, flow_name, run_input, tenant=tenant, model=model, account=account, check_models=False)
    ws = load_workspace(run.workspace_uri, run_account(run))
    agents = flow_agents(ws, Flow.model_validate(run.flow_spec))
    prompts = {name: build_system_prompt(ws, agent) for name, agent in agents.items()}
    learned_from, learned = learned_output(svc, run) if output_tokens is None else (None, {})
    assumed = DEFAULT_OUTPUT_TOKENS if output_tokens is None else output_tokens
    lanes = _Lanes(svc, run, agents, prompts, assumed, learned)
    prices = prices or catalog()
    result = Estimate(workspace=run.workspace, flow=run.flow, output_tokens=assumed)
    for group in sorted({s.group for s in run.steps}):
        steps = [s for s in run.steps if s.group == group and s.agent]
        if not steps:  # an approval
            continue
        for plan in lanes.group(group, steps):
            result.lanes.append(
                LaneEstimate(
                    plan=plan,
                    with_gate=cache_figures(plan, gate=True),
                    without_gate=cache_figures(plan, gate=False),
                    cost_with_gate=_priced(plan, prices, result.unpriced, gate=True),
                    cost_without_gate=_priced(plan, prices, result.unpriced, gate=False),
                )
            )
            result.low += _priced(plan, prices, result.unpriced, gate=True, output_scale=0.5)
            result.high += _priced(plan, prices, result.unpriced, gate=False, output_scale=2.0)
    result.learned_from = learned_from if lanes.used_learned else None
    return result


class EstimateRequest(RunOfAFlow):
    """`POST /estimates`: what a run of a flow of a workspace on an input would cache and cost."""

    output_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="output tokens a Claude turn is assumed to write (default: what the flow's previous completed run wrote"
        f" per call of the same agent and model, else {DEFAULT_OUTPUT_TOKENS})",
    )


class EstimateAnswer(BaseModel):
    """What `POST /estimates` answers (and `laneflow estimate --json` prints)."""

    workspace: str
    flow: str
    output_tokens_per_turn: int = Field(description="the output a Claude turn was assumed to write where nothing was learned")
    output_learned_from: str | None = Field(
        description="the earlier run of the flow whose output per call the Claude lanes assume"
    )
    lanes: list[dict[str, Any]] = Field(
        description="per lane: group, lane (agent@model), steps, parallel, turns, prefix_tokens, min_cacheable, cacheable, "
        "and with_gate / without_gate: cold_prefixes, cache_write, cache_read, input, output, cost_usd"
    )
    totals: dict[str, Any] = Field(description="with_gate / without_gate: cold_prefixes, cache_write, cache_read, cost_usd")
    cost_usd: dict[str, float] = Field(description="expected (with the gate), without_gate, low, high")
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
