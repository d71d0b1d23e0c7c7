"""The pure rules of a group's settlement: loop markers and targets, rescue instructions,
the run budget, and the reasons recorded with them."""

from __future__ import annotations

from laneflow.domain.flow import Flow, StepSpec
from laneflow.domain.records import (
    Run,
    RunStatus,
    Step,
)

ACTIVE = (RunStatus.queued, RunStatus.running)


STOPPED = "stopped by a person"

REJECTED = "rejected by a person"

BUDGET_SPENT = "budget spent"

SUPERSEDED = "superseded on resume"

_TRAILING = " \t\r\n.!*_`'\""



def ends_with_marker(reply: str | None, marker: str) -> bool:
    """Does the reply end with the marker (trailing spaces, punctuation and emphasis aside)?"""
    return bool(reply) and reply.rstrip(_TRAILING).endswith(marker.rstrip(_TRAILING))



def loop_target_group(flow: Flow, checker: Step, agent: str) -> int:
    """The group of the `loop:` agent: the latest entry at or before the checker's naming it."""
    for group in range(checker.group, -1, -1):
        entry = flow.entries[group]
        if any(spec.agent == agent for spec in entry.steps):
            return group
    return checker.group  # validated away by flow.py; a safe fallback



def rescue_instruction(step: Step, spec: StepSpec, error: str | None) -> str:
    parts = [
        step.instruction.strip() or f"Do the part of the flow given to {step.agent}.",
        f"This step was given to {step.agent} and failed: {error or 'no reason recorded'}. "
        "Take it over and do what it asked.",
    ]
    if spec.until:
        parts.append(f"Your reply must end with {spec.until}.")
    return "\n\n".join(parts)



def budget_spent(run: Run, spent: float | None = None) -> str | None:
    """The reason no group may start: the run's spend (its steps', when given) has reached
    its budget."""
    budget = run.options.get("budget")
    spent = run.cost_usd if spent is None else spent
    if budget and spent >= float(budget):
        return f"{BUDGET_SPENT}: ${spent:.4f} of ${float(budget):.2f}"
    return None
