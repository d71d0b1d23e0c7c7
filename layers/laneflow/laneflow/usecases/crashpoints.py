"""The named crash points of the step lifecycle: where the crash-injection suite kills a
worker, exactly as a worker that dies would (no cleanup, no finally blocks).

The use cases say each point as they pass it (`svc.crashpoints.reached(NAME)`); what that
does is the services' (`laneflow.ports.services.CrashPoints`): nothing, except in a process
the suite started with LANEFLOW_CRASH_AT=NAME (or NAME:K, the K-th time it is reached),
whose wiring gives it the points that kill it (laneflow.adapters.crash).
"""

from __future__ import annotations

POINTS = (
    "after-journal",  # the claim was asked for (journal pending), before it landed
    "after-claim",  # the attempt is claimed, nothing has run
    "executor-started",  # the prompt is built, the executor is about to call the model
    "mid-model-call",  # the model's response has begun
    "after-result",  # the attempt's result is written, the group is not settled
    "group-transition",  # between groups: NextGroup is planning the next one
    "rescue-running",  # a rescue's attempt is running
    "parked",  # the run was just parked at an approval
)
