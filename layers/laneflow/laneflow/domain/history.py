"""What one execution's history holds: events per state, counted from the definition.

Step Functions keeps at most 25,000 history events per execution, so a drive runs at most a
budget of them (`Settings.history_budget`) and continues the run in a fresh execution
before it would pass it (NextGroup's `continue`). What a state records is fixed by its
type, as AWS documents it and moto's interpreter records it (the larger where they differ):

- Task: TaskStateEntered, TaskScheduled, TaskStarted, TaskSucceeded, TaskStateExited (5);
  a callback or `.sync` Task records TaskSubmitted too (6).
- Choice, Pass: Entered and Exited (2).
- Map: MapStateEntered, MapStateStarted, MapStateSucceeded, MapStateExited (4), and 2 per
  iteration (MapIterationStarted, MapIterationSucceeded) besides the iteration's states.
- Parallel: ParallelStateEntered, Started, Succeeded, Exited (4) besides its branches'.
- An execution: ExecutionStarted and ExecutionSucceeded (2).

The Lambda handlers cannot read the definition, so the costs live beside this module in
`history_costs.json`, written by `python -m laneflow.domain.history` from
`statemachines/flow.asl.json` (a unit test fails when it is stale). A retried or caught Task
records more than its happy path (3 events a retry, a crash handler's 5): the budget's
default (18,000) leaves 2,000 of the 20,000 this project allows an execution for those, and
7,000 before AWS's own limit.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

COSTS_FILE = Path(__file__).with_name("history_costs.json")

ITERATION = 2  # MapIterationStarted, MapIterationSucceeded
EXECUTION = 2  # ExecutionStarted, ExecutionSucceeded

# The states each kind of work passes through, by name in the definition (per Map iteration).
STEP_PATHS: dict[str, tuple[str, ...]] = {
    "solo": ("StarterWaits", "RunStarter"),  # a step of an ungated lane (a lone step costs a lead's)
    "lead": ("StarterWaits", "WaitForPrefix", "RunStarter"),
    "sibling": ("WaitForLead", "RunSibling"),
    "sandboxed_solo": ("SandboxStarterWaits", "SandboxStarter"),
    "sandboxed_lead": ("SandboxStarterWaits", "SandboxWaitForPrefix", "SandboxStarter"),
    "sandboxed_sibling": ("SandboxWaitForLead", "SandboxSibling"),
    "rescue": ("RescueSandboxed", "RunRescue"),
    "sandboxed_rescue": ("RescueSandboxed", "SandboxRescue"),
}
# One lane of a group: its RunGroup iteration and the states around its steps (the larger of
# the plain and the sandboxed shape).
LANE_PATHS: tuple[tuple[str, ...], ...] = (
    ("LaneSandboxed", "RunLane", "RunStarters", "RunSiblings"),
    ("LaneSandboxed", "RunSandboxLane", "RunSandboxStarters", "RunSandboxSiblings"),
)
GROUP_PATH = ("NextGroup", "Route", "RunGroup", "SettleGroup", "AfterGroup")  # one window of a group
RESCUE_ROUND_PATH = ("RunRescues", "SettleGroup", "AfterGroup")
# What an execution records whatever it runs: its start and end, StartDrive, and the last
# NextGroup and Route before its last state (EndRun, Park or NextDrive; the larger).
DRIVE_PATH = ("StartDrive", "NextGroup", "Route")
LAST_STATES = ("EndRun", "Park", "NextDrive")


def state_events(state: dict[str, Any]) -> int:
    """The events one pass through a state records itself (a Map's iterations and a
    Parallel's branches aside)."""
    kind = state["Type"]
    if kind == "Task":
        resource = str(state.get("Resource", ""))
        return 6 if resource.endswith((".waitForTaskToken", ".sync", ".sync:2")) else 5
    if kind in ("Map", "Parallel"):
        return 4
    if kind in ("Choice", "Pass", "Wait", "Succeed"):
        return 2
    return 1  # Fail: the execution's ExecutionFailed is its only event


def _states(states: dict[str, Any], into: dict[str, int]) -> dict[str, int]:
    for name, state in states.items():
        if name in into:
            raise ValueError(f"state {name} is named twice in the definition")
        into[name] = state_events(state)
        if state["Type"] == "Map":
            _states(state["ItemProcessor"]["States"], into)
        elif state["Type"] == "Parallel":
            for branch in state["Branches"]:
                _states(branch["States"], into)
    return into


def costs_from_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """The history cost of each kind of work, from a definition (what `history_costs.json`
    holds): per step by role, per lane, per window of a group, per rescue round, per
    execution."""
    states = _states(definition["States"], {})

    def path(names: tuple[str, ...]) -> int:
        missing = [n for n in names if n not in states]
        if missing:
            raise ValueError(f"the definition has no state {', '.join(missing)}")
        return sum(states[n] for n in names)

    return {
        "states": dict(sorted(states.items())),
        "step": {role: ITERATION + path(names) for role, names in STEP_PATHS.items()},
        "lane": ITERATION + max(path(p) for p in LANE_PATHS),
        "group": path(GROUP_PATH),
        "rescue_round": path(RESCUE_ROUND_PATH),
        "drive": EXECUTION + path(DRIVE_PATH) + max(path((s,)) for s in LAST_STATES),
    }


def render(definition_file: Path) -> str:
    return json.dumps(costs_from_definition(json.loads(definition_file.read_text(encoding="utf-8"))), indent=2) + "\n"


def segment_name(run_id: str, drive: int, segment: int) -> str:
    """The execution name of segment `segment` of drive `drive` of a run: derived, so a
    retried NextDrive starts the same execution (Step Functions refuses a second one of
    the same name). At most 80 characters, as Step Functions requires."""
    tail = f"-d{drive}s{segment}"
    return run_id[: 80 - len(tail)] + tail


@dataclass(frozen=True)
class HistoryCosts:
    """The events each kind of work records in an execution's history."""

    states: dict[str, int]
    step: dict[str, int]
    lane: int
    group: int
    rescue_round: int
    drive: int

    def of_step(self, role: str, *, sandboxed: bool = False) -> int:
        return self.step[f"sandboxed_{role}" if sandboxed else role]


@lru_cache(maxsize=1)
def history_costs() -> HistoryCosts:
    data = json.loads(COSTS_FILE.read_text(encoding="utf-8"))
    return HistoryCosts(
        states=data["states"],
        step=data["step"],
        lane=data["lane"],
        group=data["group"],
        rescue_round=data["rescue_round"],
        drive=data["drive"],
    )


def main(argv: list[str]) -> int:
    """`python -m laneflow.domain.history DEFINITION` writes `history_costs.json`."""
    if len(argv) != 1:
        print("usage: python -m laneflow.domain.history statemachines/flow.asl.json", file=sys.stderr)
        return 2
    COSTS_FILE.write_text(render(Path(argv[0])), encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
