"""What the prompt cache did, read from a run's steps: the run's `lanes` rows and a step's
`cache_break`. Pure functions of the records, so every reader (the record's JSON, `show`,
the API, the viewer) and both stores give the same figures.

- A lane row is one (group, cycle, agent@model): its steps, its cold prefixes (steps whose
  calls wrote the prompt cache: each paid a cold prefix), the cache tokens its calls read and
  wrote, how long its siblings waited at the warm gate (from each waiting sibling's gate
  line to its start), what its steps' cache saved (`savings_usd`) and what the gate saved
  it (`gate_savings_usd`: laneflow.domain.savings).
- A step's `cache_break` says why it wrote a prefix that an earlier step of its agent had
  already written: the first stable layer whose hash differs, else "tools" (its tools
  differ), "model" (the earlier step ran on another model), "below-minimum" (its prefix is
  shorter than the model caches) or "expired" (the same prefix, written too long ago, or
  the earlier reply had not begun when this one was sent).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

from laneflow.domain.cache import min_cacheable
from laneflow.domain.records import EventType, PromptLayer, Step, StepStatus
from laneflow.domain.savings import lane_gate_savings_usd

WAITING_PREFIX = "prompt cache: waiting"


def _time(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def gate_wait_ms(step: Step, now: str | None = None) -> int:
    """How long the step waited at the warm gate: from its waiting line to its start (to
    `now`, or 0, while it still waits)."""
    waited = next((e for e in step.events if e.type == EventType.gate and e.text.startswith(WAITING_PREFIX)), None)
    if waited is None:
        return 0
    end = step.started_at or now
    if end is None:
        return 0
    return max(0, int((_time(end) - _time(waited.t)).total_seconds() * 1000))


def waiting_reason(step: Step) -> str | None:
    """The gate line of a sibling still waiting for its lead (None when it is not waiting)."""
    if step.status != StepStatus.pending or step.started_at:
        return None
    waited = next((e for e in step.events if e.type == EventType.gate and e.text.startswith(WAITING_PREFIX)), None)
    return waited.text if waited else None


def wrote_cache(step: Step) -> bool:
    return any(c.tokens.cache_write > 0 for c in step.calls)


def lane_rows(steps: Sequence[Step], now: str | None = None) -> list[dict[str, Any]]:
    """The run's `lanes`: one row per (group, cycle, agent@model), in order of first step.
    `savings_usd` is its steps' (laneflow.domain.savings), `gate_savings_usd` what the warm
    gate saved it (`lane_gate_savings_usd`)."""
    rows: dict[tuple[int, int, str], dict[str, Any]] = {}
    members: dict[tuple[int, int, str], list[Step]] = {}
    for step in sorted(steps, key=lambda s: s.index):
        if step.agent is None:  # an approval: no model, no lane
            continue
        lane = f"{step.agent}@{step.model}"
        key = (step.group, step.cycle, lane)
        row = rows.setdefault(
            key,
            {
                "group": step.group,
                "cycle": step.cycle,
                "lane": lane,
                "steps": 0,
                "cold_prefixes": 0,
                "cache_read": 0,
                "cache_write": 0,
                "gate_wait_ms": 0,
                "savings_usd": 0.0,
                "gate_savings_usd": 0.0,
            },
        )
        members.setdefault(key, []).append(step)
        row["steps"] += 1
        row["cold_prefixes"] += 1 if wrote_cache(step) else 0
        row["cache_read"] += sum(c.tokens.cache_read for c in step.calls)
        row["cache_write"] += sum(c.tokens.cache_write for c in step.calls)
        row["gate_wait_ms"] += gate_wait_ms(step, now)
        row["savings_usd"] += step.savings_usd
    for key, row in rows.items():
        row["savings_usd"] = round(row["savings_usd"], 6)
        row["gate_savings_usd"] = lane_gate_savings_usd(members[key])
    return list(rows.values())


def _first_difference(mine: Sequence[PromptLayer], theirs: Sequence[PromptLayer]) -> str | None:
    """The first stable layer (in assembly order) whose name or hash differs."""
    a = [layer for layer in mine if not layer.dynamic]
    b = [layer for layer in theirs if not layer.dynamic]
    for i in range(max(len(a), len(b))):
        if i >= len(a):
            return b[i].name
        if i >= len(b) or a[i].name != b[i].name or a[i].sha256 != b[i].sha256:
            return a[i].name
    return None


def cache_break(
    *,
    model: str,
    layers: Sequence[PromptLayer],
    prefix: dict[str, Any] | None,
    earlier: Sequence[tuple[str, Step]],
) -> dict[str, str] | None:
    """Why a step that has just written its prefix did not read one an earlier step of its
    agent wrote. `earlier`: (run id, step) of the same agent, nearest first (this run's,
    then the flow's previous run's). None when no earlier step wrote one."""
    if not earlier:
        return None
    same_model = [(run_id, s) for run_id, s in earlier if s.model == model]
    if not same_model:
        run_id, other = earlier[0]
        return {"layer": "model", "since": f"{run_id}/{other.index}"}
    run_id, before = same_model[0]
    since = f"{run_id}/{before.index}"
    tokens = (prefix or {}).get("tokens")
    if isinstance(tokens, int) and tokens < min_cacheable(model):
        return {"layer": "below-minimum", "since": since}
    layer = _first_difference(layers, before.prompt_layers)
    if layer:
        return {"layer": layer, "since": since}
    mine, theirs = (prefix or {}).get("tools"), (before.prefix or {}).get("tools")
    if mine and theirs and mine != theirs:
        return {"layer": "tools", "since": since}
    return {"layer": "expired", "since": since}


def started_before(other: Step, step: Step) -> bool:
    """Whether `other` started before `step` (any time, if `step` has not started). Start
    times are to the millisecond, so two siblings can share one: the lower index counts as
    the earlier, so one of them is always first."""
    if other.index == step.index or not other.started_at:
        return False
    return step.started_at is None or (other.started_at, other.index) < (step.started_at, step.index)


def writes_prefix(step: Step) -> bool:
    """Whether a step wrote its prefix (its calls say so) or, running with its layers sent,
    is writing it."""
    return bool(step.prompt_layers) and (wrote_cache(step) or step.status == StepStatus.running)


def earlier_writers(
    step: Step, this_run: tuple[str, Sequence[Step]], previous: tuple[str, Sequence[Step]] | None
) -> list[tuple[str, Step]]:
    """The steps of `step`'s agent that wrote (or, still running, are writing) its prefix
    before it: this run's, latest start first; else the previous run's, latest first."""
    run_id, steps = this_run
    mine = [s for s in steps if s.agent == step.agent and started_before(s, step) and writes_prefix(s)]
    found = [(run_id, s) for s in sorted(mine, key=lambda s: (s.started_at or "", s.index), reverse=True)]
    if found or previous is None:
        return found
    prev_id, prev_steps = previous
    theirs = [s for s in prev_steps if s.agent == step.agent and wrote_cache(s)]
    return [(prev_id, s) for s in sorted(theirs, key=lambda s: s.index, reverse=True)]
