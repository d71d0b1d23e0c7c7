"""The `size:` each sandboxed lane's tasks are started at (`lane_sizes`): its agent's, as the
run's start recorded it, one size up for every memory kill or eviction of the pass of any of
the lane's steps about to run (domain/sizes.py), so a step whose sandbox task ran out of
memory is started again in a larger one. Only the steps whose last error says so have their
attempts read: a window of a fan-out reads nothing more."""

from __future__ import annotations

from laneflow.domain.records import Run, Step
from laneflow.domain.sizes import DEFAULT_SIZE, attempt_size, larger, run_sizes
from laneflow.ports import Services
from laneflow.usecases.run_step.message import earlier_attempts

# How an interruption's reason begins when its sandbox task was stopped for memory or
# evicted (reconcile, from ecs.stopped_for): only such a step's attempts are read.
STOPPED_TASK = "interrupted: its sandbox task was"


def lane_sizes(svc: Services, run: Run, steps: list[Step]) -> dict[str, str]:
    """agent -> the size its lane's sandbox tasks run at, for the agents of `steps`."""
    base = run_sizes(run.options)
    sizes = {agent: base.get(agent, DEFAULT_SIZE) for agent in {s.agent for s in steps if s.agent}}
    for step in steps:
        if not step.agent or not (step.error or "").startswith(STOPPED_TASK):
            continue
        earlier = earlier_attempts(svc.store.list_attempts(run.tenant, run.id, step.index), since=step.started_at)
        stepped = attempt_size(base.get(step.agent), ((a.kind, a.reason) for a in earlier))
        sizes[step.agent] = larger(sizes[step.agent], stepped.size)
    return sizes
