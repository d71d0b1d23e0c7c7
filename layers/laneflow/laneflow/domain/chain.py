"""Chained flows: a flow's `then: {flow: NAME, input: {...}}` starts another run of the
workspace when a run of it completes (not when it fails or is stopped).

The chained run's input is `input:` with placeholders filled from the finished run:
- `{result.<agent>}`: the result of that agent's completed step (a rescued step carries its
  rescue's result); `{data.<agent>}`: its parsed JSON output (`output: json`);
- `{input.NAME}`: the finished run's own input;
- an agent with several completed steps (a fan-out) gives the list of them, in step order.
A string that is exactly one placeholder takes the value itself (a list stays a list, JSON
stays JSON); inside longer text a value is written as text (JSON for anything not a string).
A placeholder that names nothing found (an agent whose step did not complete) is left as
written, so the mistake stays visible in the chained run's input.

The chained run's id is derived from the finished run's (`then_key`), so however many times
the run's end is told (a re-delivered EndRun, a reconcile), one chained run is made.
"""

from __future__ import annotations

import re
from typing import Any

from laneflow.domain.placeholders import lookup_input, render_value
from laneflow.domain.records import Step, StepStatus

PLACEHOLDER = re.compile(r"\{(result|data)\.([A-Za-z0-9_][A-Za-z0-9_.-]*)\}|\{(input(?:\.[A-Za-z_][A-Za-z0-9_-]*)+)\}")

CHAIN_LIMIT = 20  # chained runs in a row (a flow chained to itself) before the chain is cut

THEN_RUN = "then_run"  # run.options: the chained run's id

THEN_ERROR = "then_error"  # run.options: why the chained run could not be started

CHAIN_DEPTH = "chain_depth"  # run.options: how many runs chained before this one

CHAINED_FROM = "chained_from"  # run.options: the run whose end started this one


def then_key(run_id: str) -> str:
    """The idempotency key of the run a finished run chains to."""
    return f"then:{run_id}"


def placeholders(value: Any) -> list[tuple[str, str]]:
    """Every `{result.X}` / `{data.X}` in a `then: input:` value: (kind, agent), in order."""
    found: list[tuple[str, str]] = []
    if isinstance(value, str):
        found += [(m.group(1), m.group(2)) for m in PLACEHOLDER.finditer(value) if m.group(1)]
    elif isinstance(value, dict):
        for item in value.values():
            found += placeholders(item)
    elif isinstance(value, list):
        for item in value:
            found += placeholders(item)
    return found


def _outcomes(steps: list[Step]) -> dict[tuple[str, str], Any]:
    by_agent: dict[tuple[str, str], list[Any]] = {}
    for step in sorted(steps, key=lambda s: s.index):
        if step.agent is None or step.rescue_of is not None or step.status != StepStatus.completed:
            continue
        by_agent.setdefault(("result", step.agent), []).append(step.result)
        by_agent.setdefault(("data", step.agent), []).append(step.data)
    return {key: values[0] if len(values) == 1 else values for key, values in by_agent.items()}


def fill_then_input(template: Any, run_input: Any, steps: list[Step]) -> Any:
    """`then: input:` filled from a finished run's input and steps (see the module docstring)."""
    outcomes = _outcomes(steps)

    def lookup(match: re.Match[str]) -> tuple[bool, Any]:
        if match.group(1):
            key = (match.group(1), match.group(2))
            return (key in outcomes), outcomes.get(key)
        return lookup_input(run_input, match.group(3))

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        if not isinstance(value, str):
            return value
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            found, got = lookup(whole)
            return got if found else value

        def replace(match: re.Match[str]) -> str:
            found, got = lookup(match)
            return render_value(got) if found else match.group(0)

        return PLACEHOLDER.sub(replace, value)

    return fill(template)
