"""The run-level signals of the prompt-cache TTL choice (laneflow.domain.cache_ttl), worked out
once as a run starts and kept in `run.options["cache_ttl"]`:

    {AGENT: {"setting": "5m" | "1h" | "auto", "where": FILE or None,
             "later_wave_s": S or None, "loop_cycle_s": S or None,
             "parks_for_approval": bool, "flow_start_gap_s": S or None}}

for every agent of the flow (its steps', their rescuers', the agents they may delegate to).
What a step adds when it runs (the registry's gap since its prefix's last use) and the choice
itself are `domain.cache_ttl.choose_for`.

What is read: the flow (as parsed for this run), the run's own expanded steps (so a fan-out
over the input counts its items), and of the store only the flow's latest earlier run in the
same tenant and workspace among the tenant's last PREVIOUS_RUNS_LOOKED_AT: its start, its
steps without their messages or details, and, when this flow loops, its flow as it ran.
Durations come from the records' wall-clock times, turned into the cache clock's seconds (a
benchmark's sped-up clock runs the TTLs too). A failure to read is logged, and leaves the
signals it would have given unknown: it never stops a run from starting.
"""

from __future__ import annotations

import datetime as _dt
import logging
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from laneflow.domain.cache import clock_of
from laneflow.domain.cache_ttl import DEFAULT_SETTING
from laneflow.domain.flow import Flow
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import Run, Step, StepStatus
from laneflow.ports import Services

if TYPE_CHECKING:
    from laneflow.domain.workspace import Agent, Workspace

log = logging.getLogger("laneflow.run")

PREVIOUS_RUNS_LOOKED_AT = 50  # as usecases/run_step/cache_break.previous_run looks back

Span = tuple[int, int]  # an evaluator loop's groups: from its `loop:` agent's through its checker's


def _at(stamp: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _wall_s(since: str, until: str) -> float:
    return (_at(until) - _at(since)).total_seconds()


def cache_seconds(wall_s: float, clock: str | None) -> float:
    """Wall-clock seconds as the cache clock `clock` counts them (LANEFLOW_CACHE_CLOCK's rate)."""
    rate, _ = clock_of(clock)
    return wall_s * rate


def setting_of(agent: Agent, ws: Workspace) -> tuple[str, str | None]:
    """An agent's `cache_ttl` and the file that set it: its agent.md's, else AGENTS.md's (the
    workspace's, else the account's), else the default (`auto`, from no file: None)."""
    if agent.settings.cache_ttl is not None:
        return agent.settings.cache_ttl, f"{agent.path}/agent.md"
    if "cache_ttl" in ws.settings.model_fields_set:
        return ws.settings.cache_ttl, "AGENTS.md"
    return DEFAULT_SETTING, None


def loop_spans(flow: Flow) -> list[Span]:
    """Each evaluator loop's groups: from the latest group at or before its checker's that has
    the `loop:` agent (as the settlement goes back to), through the checker's."""
    spans = []
    for group, entry in enumerate(flow.entries):
        for spec in entry.steps:
            if spec.until and spec.loop:
                target = next(
                    (g for g in range(group, -1, -1) if any(s.agent == spec.loop for s in flow.entries[g].steps)), group
                )
                spans.append((target, group))
    return spans


def _groups_of(flow: Flow, agent: str) -> list[int]:
    return [group for group, entry in enumerate(flow.entries) if any(spec.agent == agent for spec in entry.steps)]


def parks_between_uses(flow: Flow, agent: str) -> bool:
    """The run parks for an approval between two uses of the agent: an approval after one of
    its groups and before a later one, or inside a loop the agent is in (the loop goes back
    past the approval to the agent, or comes again to the approval before the agent's next
    cycle)."""
    groups = _groups_of(flow, agent)
    approvals = [group for group, entry in enumerate(flow.entries) if entry.kind == "approval"]
    if not groups or not approvals:
        return False
    if any(groups[0] < a < groups[-1] for a in approvals):
        return True
    return any(
        any(start <= g <= end for g in groups) and any(start < a < end for a in approvals) for start, end in loop_spans(flow)
    )


def wide_lanes(run: Run, flow: Flow, max_parallel: int) -> set[str]:
    """The agents with a lane (a group's steps of one agent and model) of more steps than it
    runs at once (its entries' tightest `parallel:`, else `max_parallel`): later waves."""
    lanes: dict[tuple[int, str, str], list[Step]] = {}
    for step in run.steps:
        if step.agent and step.rescue_of is None:
            lanes.setdefault((step.group, step.agent, step.model), []).append(step)
    wide = set()
    for (_, agent, _), steps in lanes.items():
        caps = [flow.spec(s.entry, s.slot).parallel for s in steps]
        cap = min([c for c in caps if c] + [max_parallel])
        if len(steps) > cap:
            wide.add(agent)
    return wide


def latest_earlier_run(svc: Services, run: Run) -> Run | None:
    """The flow's latest run before this one in the same tenant and workspace, among the
    tenant's last PREVIOUS_RUNS_LOOKED_AT (without its steps)."""
    for other in svc.store.list_runs(run.tenant, limit=PREVIOUS_RUNS_LOOKED_AT):
        if (
            other.id != run.id
            and other.workspace == run.workspace
            and other.flow == run.flow
            and other.created_at < run.created_at
        ):
            return other
    return None


def median_step_s(steps: list[Step], agent: str) -> float | None:
    """The median wall-clock duration of the agent's completed steps, if it has any."""
    durations = [
        _wall_s(s.started_at, s.finished_at)
        for s in steps
        if s.agent == agent and s.status == StepStatus.completed and s.started_at and s.finished_at
    ]
    return statistics.median(durations) if durations else None


def last_cycle_s(steps: list[Step], span: Span) -> float | None:
    """How long a run's last cycle of a loop took (wall clock): its steps' first start to last
    end. A cycle resets its steps' times, so what a run keeps is its last cycle's."""
    start, end = span
    inside = [s for s in steps if start <= s.group <= end and s.started_at and s.finished_at]
    if not inside:
        return None
    return _wall_s(min(s.started_at or "" for s in inside), max(s.finished_at or "" for s in inside))


class _Previous:
    """What the flow's latest earlier run tells, read once and only as far as it is asked."""

    def __init__(self, svc: Services, run: Run):
        self.svc, self.run = svc, run
        self.found = latest_earlier_run(svc, run)
        self._steps: list[Step] | None = None
        self._flow: Flow | None = None

    def start_gap_s(self) -> float | None:
        """The gap between the flow's latest earlier start and this one (not between the two
        earlier ones): the latest interval, the one that ends as this run writes its prefixes,
        and known from the flow's second run on."""
        return (
            cache_seconds(_wall_s(self.found.created_at, self.run.created_at), self.svc.settings.cache_clock)
            if self.found
            else None
        )

    def steps(self) -> list[Step]:
        if self._steps is None:
            self._steps = (
                self.svc.store.get_steps(self.run.tenant, self.found.id, messages=False, where=StepFilter(flow=True))
                if self.found
                else []
            )
        return self._steps

    def flow(self) -> Flow | None:
        if self._flow is None and self.found is not None:
            spec = self.svc.store.get_run(self.run.tenant, self.found.id, steps=False).flow_spec
            self._flow = Flow.model_validate(spec) if spec else None
        return self._flow

    def wave_s(self, agent: str) -> float | None:
        median = median_step_s(self.steps(), agent)
        return cache_seconds(median, self.svc.settings.cache_clock) if median is not None else None

    def cycle_s(self, agent: str) -> float | None:
        flow = self.flow()
        if flow is None:
            return None
        groups = set(_groups_of(flow, agent))
        for span in loop_spans(flow):
            if any(span[0] <= g <= span[1] for g in groups) and (took := last_cycle_s(self.steps(), span)) is not None:
                return cache_seconds(took, self.svc.settings.cache_clock)
        return None


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _measured(previous: _Previous | None, agent: str, *, wide: bool, loops: bool) -> dict[str, float | None]:
    """The signals read from the previous run, each None when it cannot be told."""
    out: dict[str, float | None] = {"later_wave_s": None, "loop_cycle_s": None, "flow_start_gap_s": None}
    if previous is None:
        return out
    try:
        out["flow_start_gap_s"] = previous.start_gap_s()
        out["later_wave_s"] = previous.wave_s(agent) if wide else None
        out["loop_cycle_s"] = previous.cycle_s(agent) if loops else None
    except Exception:  # a signal is a nicety; the run starts without it
        log.warning("run %s: the cache TTL signals of %s could not be read", previous.run.id, agent, exc_info=True)
    return out


def run_ttl_signals(
    svc: Services, run: Run, flow: Flow, workspace: Workspace, agents: Mapping[str, Agent] | None = None
) -> dict[str, dict[str, Any]]:
    """Every agent's `cache_ttl` setting and the run-level signals of its TTL choice, as kept
    in `run.options["cache_ttl"]` (this module's docstring has the shape). `agents`: the
    flow's agents as the start read them (`start_run.flow_agents`; read here when not given).
    The store is read only when some agent is `auto`."""
    if agents is None:
        from laneflow.usecases.start_run import flow_agents  # it records what this returns

        agents = flow_agents(workspace, flow)
    settings = {name: setting_of(agent, workspace) for name, agent in agents.items()}
    previous: _Previous | None = None
    if any(setting == "auto" for setting, _ in settings.values()):
        try:
            previous = _Previous(svc, run)
        except Exception:
            log.warning("run %s: the flow's earlier runs could not be read for the cache TTL", run.id, exc_info=True)
    wide = wide_lanes(run, flow, svc.settings.max_lane_parallel)
    looping = {name for name in agents if any(s <= g <= e for s, e in loop_spans(flow) for g in _groups_of(flow, name))}
    signals: dict[str, dict[str, Any]] = {}
    for name, (setting, where) in settings.items():
        measured = _measured(previous, name, wide=name in wide, loops=name in looping) if setting == "auto" else {}
        signals[name] = {
            "setting": setting,
            "where": where,
            "later_wave_s": _rounded(measured.get("later_wave_s")),
            "loop_cycle_s": _rounded(measured.get("loop_cycle_s")),
            "parks_for_approval": parks_between_uses(flow, name),
            "flow_start_gap_s": _rounded(measured.get("flow_start_gap_s")),
        }
    return signals
