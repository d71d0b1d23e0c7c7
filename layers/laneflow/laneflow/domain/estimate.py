"""A run's prompt-cache and cost estimate, before anything runs (`laneflow estimate`).

Per lane (a group's steps sharing an agent and a model) it takes the prefix the steps would
send (their tools and stable system prompt, counted like `domain.cache`), how many steps and
turns it has and how many run at once, and works out the cache writes and reads:

- With the warm gate (or a lane that runs one step at a time): one cold prefix, the lead's;
  every other step and every later turn reads it.
- Without the gate: the first `parallel` steps start together and each writes it; the rest
  start after a reply has begun and read it; later turns read it.
- Below the model's minimum cacheable prefix nothing is cached: the prefix is plain input.

Cost: cache writes and reads, the uncached input (the dynamic layers, the instruction, the
handoff) and the output at the catalog's prices. The output is what an estimate cannot
know: it assumes `output_tokens` per turn on Claude (the range is half to twice that, the low
end with the gate and the high end without it); on the stub the agent's own answers give the
turns, the output and the `cost:` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laneflow.domain.records import Tokens

DEFAULT_OUTPUT_TOKENS = 400  # per turn, on Claude: a page of prose


@dataclass(frozen=True)
class LanePlan:
    """What the estimate knows of one lane before it runs."""

    group: int
    agent: str
    model: str
    steps: int
    parallel: int
    prefix_tokens: int  # tools + stable system, per request
    min_cacheable: int  # 0: it always caches (the stub)
    turns: int  # per step
    input_tokens: int  # uncached input of a step's first turn (dynamic layers, message, handoff)
    output_tokens: int  # per turn
    stub_cost_usd: float | None = None  # the stub's `cost:` for the whole lane (None: priced)
    gated: bool = True  # the run's warm gate is on

    @property
    def lane(self) -> str:
        return f"{self.agent}@{self.model}"


@dataclass(frozen=True)
class CacheFigures:
    cold_prefixes: int
    cache_write: int
    cache_read: int
    input: int
    output: int

    def tokens(self) -> Tokens:
        return Tokens(input=self.input, output=self.output, cache_read=self.cache_read, cache_write=self.cache_write)


@dataclass
class LaneEstimate:
    plan: LanePlan
    with_gate: CacheFigures
    without_gate: CacheFigures
    cost_with_gate: float = 0.0
    cost_without_gate: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "group": p.group,
            "lane": p.lane,
            "steps": p.steps,
            "parallel": p.parallel,
            "turns": p.turns,
            "prefix_tokens": p.prefix_tokens,
            "min_cacheable": p.min_cacheable,
            "cacheable": p.prefix_tokens >= p.min_cacheable,
            "with_gate": {**self.with_gate.__dict__, "cost_usd": round(self.cost_with_gate, 6)},
            "without_gate": {**self.without_gate.__dict__, "cost_usd": round(self.cost_without_gate, 6)},
        }


def cache_figures(plan: LanePlan, *, gate: bool) -> CacheFigures:
    """The lane's cache writes and reads, and its other tokens, with or without the gate."""
    requests = plan.steps * plan.turns
    later_turns = plan.steps * (plan.turns - 1)
    output = requests * plan.output_tokens
    # Later turns also send the earlier turns' text: about one turn's output each.
    uncached = plan.steps * plan.input_tokens + later_turns * plan.output_tokens
    if plan.prefix_tokens < plan.min_cacheable or plan.prefix_tokens == 0:
        return CacheFigures(0, 0, 0, uncached + requests * plan.prefix_tokens, output)
    together = 1 if gate or plan.parallel <= 1 else min(plan.parallel, plan.steps)
    reads = (plan.steps - together) + later_turns
    return CacheFigures(together, together * plan.prefix_tokens, reads * plan.prefix_tokens, uncached, output)


@dataclass
class Estimate:
    workspace: str
    flow: str
    lanes: list[LaneEstimate] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)  # models the catalog has no price for
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    # The run whose output per call the Claude lanes it covers assume (the flow's previous
    # completed run), when the output was not given.
    learned_from: str | None = None
    low: float = 0.0  # with the gate, the output at half the assumption
    high: float = 0.0  # without the gate, the output at twice the assumption

    @property
    def cost_with_gate(self) -> float:
        return sum(lane.cost_with_gate for lane in self.lanes)

    @property
    def cost_without_gate(self) -> float:
        return sum(lane.cost_without_gate for lane in self.lanes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace,
            "flow": self.flow,
            "output_tokens_per_turn": self.output_tokens,
            "output_learned_from": self.learned_from,
            "lanes": [lane.as_dict() for lane in self.lanes],
            "totals": {
                "with_gate": _totals(self.lanes, gate=True),
                "without_gate": _totals(self.lanes, gate=False),
            },
            "cost_usd": {
                "expected": round(self.cost_with_gate, 6),
                "without_gate": round(self.cost_without_gate, 6),
                "low": round(self.low, 6),
                "high": round(self.high, 6),
            },
            "unpriced_models": self.unpriced,
        }


def _totals(lanes: list[LaneEstimate], *, gate: bool) -> dict[str, Any]:
    figures = [lane.with_gate if gate else lane.without_gate for lane in lanes]
    return {
        "cold_prefixes": sum(f.cold_prefixes for f in figures),
        "cache_write": sum(f.cache_write for f in figures),
        "cache_read": sum(f.cache_read for f in figures),
        "cost_usd": round(sum(lane.cost_with_gate if gate else lane.cost_without_gate for lane in lanes), 6),
    }
