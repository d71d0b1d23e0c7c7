"""A run's prompt-cache and cost estimate, before anything runs (`laneflow estimate`).

Per lane (a group's steps sharing an agent and a model) it takes the prefix the steps would
send (their tools and stable system prompt, counted like `domain.cache`), how many steps and
turns it has and how many run at once, and works out the cache writes and reads:

- With the warm gate (or a lane that runs one step at a time): one cold prefix, the lead's;
  every other step and every later turn reads it.
- Without the gate: the first `parallel` steps start together and each writes it; the rest
  start after a reply has begun and read it; later turns read it.
- A prefix that is already in the cache when the lead starts is read, not written, by the
  lead too: one the prefix registry holds as warm now (`PrefixRecord.warm`) or as being
  written now by another run's step (the gate makes the lead wait for it and read), and one an
  earlier lane of the same run writes (the same agent and model in an earlier group).
- Below the model's minimum cacheable prefix nothing is cached: the prefix is plain input.

Cost: cache writes and reads, the uncached input (the dynamic layers, the instruction, the
handoff, and on later turns what the earlier turns said and what their tools answered) and
the output at the catalog's prices. What a model will write, and how many turns it takes,
an estimate cannot know; on the stub the agent's own answers give the turns, the output and
the `cost:` exactly. On Claude the estimate is a point inside a range (`RANGE_RULE`):

- point: the turns and the output a step of the same agent and model had in the flow's
  previous completed run (`Usage`, learned), else one turn of `output_tokens`
  (DEFAULT_OUTPUT_TOKENS unless told), with the gate and the cache as said above;
- low: one turn a step, each reply SHORT_REPLY_TOKENS long (a one-sentence outcome, which
  every step is told to open with), every cacheable prefix already warm (a cache the
  registry may not know of: the same prompts run elsewhere on the same account), and the
  prefix and inputs counted TOKEN_MARGIN short;
- high: an agent that can call tools takes its `max_turns` (else the executor's
  DEFAULT_MAX_TURNS) turns, each reply LONG_REPLY_FACTOR times the point's and each tool
  call answering TOOL_RESULT_TOKENS, all resent on every later turn; no gate, no prefix read
  from before its own lane's first reply (a registry's warm entry may expire first), cache
  writes at the 1-hour price, the prefix and inputs counted TOKEN_MARGIN over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from laneflow.domain.cache import cache_iso
from laneflow.domain.prefixes import PrefixRecord, PrefixTTL
from laneflow.domain.pricing import PriceCatalog
from laneflow.domain.records import Step, Tokens

DEFAULT_OUTPUT_TOKENS = 400  # per turn, on Claude: a page of prose

# A step's model turns when its agent.md sets no `max_turns` (the Claude executor's limit).
DEFAULT_MAX_TURNS = 16

# The low end's reply: a one-sentence outcome ("Filed the tide table for Brest." is 8 tokens
# at 4 characters a token), which the `rules` layer tells every step to open its reply with.
SHORT_REPLY_TOKENS = 5

# The high end's reply: twice the point's (the point being 400 tokens, a page, unless told
# or learned).
LONG_REPLY_FACTOR = 2

# The high end's tool result: a page (a file tool's read, a script's stdout); bash and the
# API tools cut theirs at 30,000 characters, 7,500 tokens.
TOOL_RESULT_TOKENS = 1_000

# The prefix and the inputs are counted as characters / 4, as the imitation counts them; the
# real tokenizer differs by some per cent. The low end counts them this much short, the high
# end this much over.
TOKEN_MARGIN = 0.10

HANDOFF_HEADER_TOKENS = 8  # "## Handoff from the previous group" and each step's "### agent — item (step N)"

RANGE_RULE = (
    f"low: one turn a step, {SHORT_REPLY_TOKENS}-token replies, every prefix already warm, "
    f"tokens counted {TOKEN_MARGIN:.0%} short; high: max_turns turns for an agent with tools, replies "
    f"{LONG_REPLY_FACTOR}x the point's, {TOOL_RESULT_TOKENS:,}-token tool results, no gate, no prefix warm "
    f"from before, 1-hour cache writes, tokens {TOKEN_MARGIN:.0%} over"
)

CaseName = Literal["low", "point", "high"]
# What a lead finds in the cache: every cacheable prefix warm, what the registry and the
# run's earlier lanes say, or nothing from before its own lane.
CacheView = Literal["warm", "known", "cold"]


@dataclass(frozen=True)
class Case:
    """One end of the range, or the point: how it counts the cache and the tokens."""

    name: CaseName
    gate: bool  # priced with the gate's cache figures
    cache: CacheView  # what a lead finds in the cache when it starts
    token_scale: float  # the prefix and the inputs as counted, times this
    write_ttl: PrefixTTL  # the price its cache writes pay


LOW = Case("low", gate=True, cache="warm", token_scale=1 - TOKEN_MARGIN, write_ttl="5m")
POINT = Case("point", gate=True, cache="known", token_scale=1.0, write_ttl="5m")
HIGH = Case("high", gate=False, cache="cold", token_scale=1 + TOKEN_MARGIN, write_ttl="1h")


@dataclass(frozen=True)
class Usage:
    """What a step of a lane does, per step: its turns, the output of each turn, what each
    later turn sends beyond the first turn's input (the earlier turns, their tool results),
    and what its delegates' calls cost."""

    turns: float
    output_tokens: int
    later_input_tokens: int
    extra_usd: float = 0.0


@dataclass(frozen=True)
class StubAnswers:
    """A stub lane's own answers: turns a step, output a turn, and the whole lane's `cost:`."""

    turns: int
    output_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class LaneFacts:
    """What the estimate knows of one lane before it runs, whatever the case."""

    group: int
    agent: str
    model: str
    steps: int
    parallel: int
    prefix_tokens: int  # tools + stable system, per request
    min_cacheable: int  # 0: it always caches (the stub)
    prefix_key: str  # the prefix registry's key (the steps' `job_prefix_key`)
    inputs: tuple[int, ...]  # per step: its first turn's uncached input, without the handoff
    takes_handoff: tuple[bool, ...]  # per step: whether the previous group's handoff is added to it
    max_turns: int
    has_tools: bool
    stub: StubAnswers | None = None
    learned: Usage | None = None  # what the flow's previous completed run measured
    registry: PrefixRecord | None = None  # the registry's record of the prefix, as read now

    @property
    def lane(self) -> str:
        return f"{self.agent}@{self.model}"

    @property
    def cacheable(self) -> bool:
        return self.prefix_tokens > 0 and self.prefix_tokens >= self.min_cacheable


@dataclass(frozen=True)
class LanePlan:
    """One lane as one case counts it."""

    group: int
    agent: str
    model: str
    steps: int
    parallel: int
    prefix_tokens: int  # tools + stable system, per request
    min_cacheable: int  # 0: it always caches (the stub)
    turns: float  # per step
    input_tokens: int  # uncached input of a step's first turn (dynamic layers, message, handoff)
    output_tokens: int  # per turn
    later_input_tokens: int | None = None  # per later turn, beyond the first's (None: one turn's output)
    stub_cost_usd: float | None = None  # the stub's `cost:` for the whole lane (None: priced)
    extra_usd: float = 0.0  # per step: its delegates' calls
    # Why its lead reads the prefix instead of writing it ("warm now (run R)", ...), if it does;
    # `reads_ungated`: whether it does without the gate too (a prefix being written now by
    # another run is read only by a lead that waits for it).
    lead_reads: str | None = None
    reads_ungated: bool = True

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


def cache_figures(plan: LanePlan, *, gate: bool) -> CacheFigures:
    """The lane's cache writes and reads, and its other tokens, with or without the gate."""
    requests = plan.steps * plan.turns
    later_turns = plan.steps * (plan.turns - 1)
    output = round(requests * plan.output_tokens)
    if plan.later_input_tokens is None:  # the stub counts a later turn's input as about one turn's output
        uncached = plan.steps * plan.input_tokens + round(later_turns * plan.output_tokens)
    else:  # a later turn resends the first turn's input, then the turns before it and their tool results
        uncached = round(requests * plan.input_tokens + later_turns * plan.later_input_tokens)
    if plan.prefix_tokens < plan.min_cacheable or plan.prefix_tokens == 0:
        return CacheFigures(0, 0, 0, uncached + round(requests * plan.prefix_tokens), output)
    if plan.lead_reads and (gate or plan.reads_ungated):
        together = 0
    else:
        together = 1 if gate or plan.parallel <= 1 else min(plan.parallel, plan.steps)
    reads = round(requests) - together
    return CacheFigures(together, together * plan.prefix_tokens, reads * plan.prefix_tokens, uncached, output)


# -- the cases: what a step is assumed to do --------------------------------------------------


def point_usage(facts: LaneFacts, output_tokens: int) -> Usage:
    """The point's step: the stub's own answers; else what the previous run measured; else
    one turn of `output_tokens`."""
    if facts.stub is not None:
        return Usage(facts.stub.turns, facts.stub.output_tokens, facts.stub.output_tokens)
    if facts.learned is not None:
        return facts.learned
    return Usage(1, output_tokens, output_tokens)


def case_usage(case: Case, facts: LaneFacts, output_tokens: int) -> Usage:
    """What a step of the lane is assumed to do in `case` (the stub's answers are exact in all)."""
    point = point_usage(facts, output_tokens)
    if facts.stub is not None or case.name == "point":
        return point
    if case.name == "low":
        return Usage(1, min(SHORT_REPLY_TOKENS, point.output_tokens), 0)
    reply = LONG_REPLY_FACTOR * point.output_tokens
    turns = max(point.turns, float(facts.max_turns if facts.has_tools else 1))
    # Turn k resends the k - 1 before it (a reply and a tool result each): k - 1 of them on
    # average over the later turns is turns / 2.
    resent = round((reply + TOOL_RESULT_TOKENS) * turns / 2)
    return Usage(turns, reply, max(resent, LONG_REPLY_FACTOR * point.later_input_tokens), LONG_REPLY_FACTOR * point.extra_usd)


def _lead_reads(case: Case, facts: LaneFacts, written: dict[str, int], now: float) -> tuple[str | None, bool]:
    """Why the lane's lead reads its prefix in `case`, if it does, and whether without the gate too."""
    if case.cache == "cold" or not facts.cacheable:
        return None, True
    if case.cache == "warm":
        return "warm (the low end assumes every prefix is)", True
    record = facts.registry
    if record is not None and facts.stub is None:  # the stub's pretend cache is one run's
        if record.warm(now):
            return f"warm now (run {record.warmed_by})" if record.warmed_by else "warm now", True
        if record.writing(now) and record.writer is not None:
            return f"being written now (run {record.writer.run_id})", False
    if facts.prefix_key in written:
        return f"written in group {written[facts.prefix_key]} of this run", True
    return None, True


def case_plans(groups: list[list[LaneFacts]], case: Case, *, output_tokens: int, now: float) -> list[LanePlan]:
    """Every lane of the run as `case` counts it, group by group: a group's handoff (what its
    steps said) joins the next group's inputs; a prefix a lane writes is read by a later
    lane's lead (unless the case finds the cache cold)."""
    plans: list[LanePlan] = []
    written: dict[str, int] = {}
    handoff = 0
    for lanes in groups:
        handed_on = 0
        for facts in lanes:
            usage = case_usage(case, facts, output_tokens)
            reads, ungated = _lead_reads(case, facts, written, now)
            inputs = [own + (handoff if takes else 0) for own, takes in zip(facts.inputs, facts.takes_handoff, strict=True)]
            plans.append(
                LanePlan(
                    group=facts.group,
                    agent=facts.agent,
                    model=facts.model,
                    steps=facts.steps,
                    parallel=facts.parallel,
                    prefix_tokens=facts.prefix_tokens,
                    min_cacheable=facts.min_cacheable,
                    turns=usage.turns,
                    input_tokens=sum(inputs) // max(1, len(inputs)),
                    output_tokens=usage.output_tokens,
                    later_input_tokens=None if facts.stub is not None else usage.later_input_tokens,
                    stub_cost_usd=facts.stub.cost_usd if facts.stub is not None else None,
                    extra_usd=usage.extra_usd,
                    lead_reads=reads,
                    reads_ungated=ungated,
                )
            )
            if facts.cacheable:
                written.setdefault(facts.prefix_key, facts.group)
            handed_on += round(facts.steps * (usage.turns * usage.output_tokens + HANDOFF_HEADER_TOKENS))
        handoff = handed_on + HANDOFF_HEADER_TOKENS if handed_on else 0
    return plans


def priced(plan: LanePlan, prices: PriceCatalog, unpriced: list[str], case: Case, *, gate: bool | None = None) -> float:
    """The lane's cost in `case` (with the case's gate unless `gate` says); a model the
    catalog has no price for costs 0 and is listed in `unpriced`."""
    if plan.stub_cost_usd is not None:
        return plan.stub_cost_usd
    price = prices.price(plan.model)
    if price is None:
        if plan.model not in unpriced:
            unpriced.append(plan.model)
        return 0.0
    f = cache_figures(plan, gate=case.gate if gate is None else gate)
    scale = case.token_scale
    tokens = Tokens(
        input=round(f.input * scale),
        output=f.output,
        cache_read=round(f.cache_read * scale),
        cache_write=round(f.cache_write * scale),
    )
    return price.cost(tokens, cache_ttl=case.write_ttl) + plan.steps * plan.extra_usd


# -- what an earlier run measured ---------------------------------------------------------------


UsageKey = tuple[int | None, str, str]  # (the flow's entry, or None for any, agent, model)


def usage_of(steps: list[Step]) -> dict[UsageKey, Usage]:
    """What a step of an ended run did on average, from the model calls of each step's last
    attempt: turns, output per turn, what a later turn sent beyond the first's, and its
    delegates' cost. Keyed by (entry, agent, model), the steps of one entry of `steps:` (an
    agent may do one thing in one entry and another in the next), and by (None, agent, model)."""
    per: dict[UsageKey, list[tuple[list[Tokens], float]]] = {}
    for step in steps:
        last = max(1, step.attempts)
        calls = sorted((c for c in step.calls if (c.attempt or 1) == last), key=lambda c: c.n)
        own = [c.tokens for c in calls if c.delegate is None]
        if own:
            delegated = sum(c.cost_usd for c in calls if c.delegate is not None)
            for key in ((step.entry, step.agent or "", step.model), (None, step.agent or "", step.model)):
                per.setdefault(key, []).append((own, delegated))
    return {key: _mean_usage(rows) for key, rows in per.items()}


def _mean_usage(rows: list[tuple[list[Tokens], float]]) -> Usage:
    outputs = [t.output for tokens, _ in rows for t in tokens]
    later = [t.input - tokens[0].input for tokens, _ in rows for t in tokens[1:]]
    return Usage(
        turns=sum(len(tokens) for tokens, _ in rows) / len(rows),
        output_tokens=round(sum(outputs) / len(outputs)),
        later_input_tokens=max(0, round(sum(later) / len(later))) if later else 0,
        extra_usd=sum(d for _, d in rows) / len(rows),
    )


# -- the estimate ---------------------------------------------------------------------------------


@dataclass
class LaneEstimate:
    facts: LaneFacts
    plan: LanePlan  # the point's
    with_gate: CacheFigures
    without_gate: CacheFigures
    cost_with_gate: float = 0.0
    cost_without_gate: float = 0.0
    low: float = 0.0
    high: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        p, f = self.plan, self.facts
        record = f.registry
        warm = None
        if record is not None and p.lead_reads and p.lead_reads.startswith("warm now"):
            until = record.warm_until()
            warm = {
                "run": record.warmed_by,
                "since": cache_iso(record.last_use() or 0.0),
                "until": cache_iso(until) if until is not None else None,
            }
        return {
            "group": p.group,
            "lane": p.lane,
            "steps": p.steps,
            "parallel": p.parallel,
            "turns": round(p.turns, 2),
            "output_tokens_per_turn": p.output_tokens,
            "learned": f.learned is not None and f.stub is None,
            "prefix_tokens": p.prefix_tokens,
            "prefix_key": f.prefix_key,
            "min_cacheable": p.min_cacheable,
            "cacheable": f.cacheable,
            "lead": "reads" if p.lead_reads else ("writes" if f.cacheable else "uncached"),
            "lead_reads": p.lead_reads,
            "warm_now": warm,
            "with_gate": {**self.with_gate.__dict__, "cost_usd": round(self.cost_with_gate, 6)},
            "without_gate": {**self.without_gate.__dict__, "cost_usd": round(self.cost_without_gate, 6)},
            "range_usd": {"low": round(self.low, 6), "high": round(self.high, 6)},
        }


@dataclass
class Estimate:
    workspace: str
    flow: str
    lanes: list[LaneEstimate] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)  # models the catalog has no price for
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    # The run whose turns and output per call the Claude lanes it covers assume (the flow's
    # previous completed run), when the output was not given.
    learned_from: str | None = None

    @property
    def cost_with_gate(self) -> float:
        return sum(lane.cost_with_gate for lane in self.lanes)

    @property
    def cost_without_gate(self) -> float:
        return sum(lane.cost_without_gate for lane in self.lanes)

    @property
    def low(self) -> float:
        return sum(lane.low for lane in self.lanes)

    @property
    def high(self) -> float:
        return sum(lane.high for lane in self.lanes)

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
            "range_rule": RANGE_RULE,
            "unpriced_models": self.unpriced,
        }


def estimate_of(
    workspace: str,
    flow: str,
    groups: list[list[LaneFacts]],
    prices: PriceCatalog,
    *,
    output_tokens: int,
    now: float,
) -> Estimate:
    """The estimate of a run whose lanes are `groups` (in the order they run), at `now` on
    the cache clock, each Claude turn of a lane with nothing learned writing `output_tokens`."""
    result = Estimate(workspace=workspace, flow=flow, output_tokens=output_tokens)
    point, low, high = (case_plans(groups, case, output_tokens=output_tokens, now=now) for case in (POINT, LOW, HIGH))
    facts = [f for lanes in groups for f in lanes]
    for f, plan, low_plan, high_plan in zip(facts, point, low, high, strict=True):
        result.lanes.append(
            LaneEstimate(
                facts=f,
                plan=plan,
                with_gate=cache_figures(plan, gate=True),
                without_gate=cache_figures(plan, gate=False),
                cost_with_gate=priced(plan, prices, result.unpriced, POINT),
                cost_without_gate=priced(plan, prices, result.unpriced, POINT, gate=False),
                low=priced(low_plan, prices, result.unpriced, LOW),
                high=priced(high_plan, prices, result.unpriced, HIGH),
            )
        )
    return result


def _totals(lanes: list[LaneEstimate], *, gate: bool) -> dict[str, Any]:
    figures = [lane.with_gate if gate else lane.without_gate for lane in lanes]
    return {
        "cold_prefixes": sum(f.cold_prefixes for f in figures),
        "cache_write": sum(f.cache_write for f in figures),
        "cache_read": sum(f.cache_read for f in figures),
        "cost_usd": round(sum(lane.cost_with_gate if gate else lane.cost_without_gate for lane in lanes), 6),
    }
