"""What the state machine passes to each handler and gets back (one model per handler).

The state machine carries ids, pointers and statuses only (a state passes at most 256 KB): prompts,
results and traces stay in the store. Every model ignores fields it does not know, so a
field can be added to the definition without breaking a deployed handler.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from laneflow.domain.records import RunStatus, StepStatus
from laneflow.domain.sizes import DEFAULT_SIZE, task_overrides


def _default_task() -> dict[str, str]:
    return task_overrides(DEFAULT_SIZE)


class Contract(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExecutionInput(Contract):
    """What an execution of the state machine is started with. A continuation (a drive
    going on in a fresh execution: NextDrive) names its drive and its segment number; a
    drive's first execution has segment 0."""

    tenant: str
    run_id: str
    drive: int = 0
    segment: int = 0


class StartDriveRequest(Contract):
    tenant: str
    run_id: str
    execution: str = ""  # $$.Execution.Id
    input: ExecutionInput | None = None  # the execution's input ($)

    @property
    def segment(self) -> int:
        return self.input.segment if self.input is not None else 0


class DriveRef(Contract):
    """Which run, and which drive of it, a state is working for: `$.run` in the definition."""

    tenant: str
    run_id: str
    drive: int = 0
    segment: int = 0  # which execution of this drive (0: its first; NextDrive counts on)


class LaneStep(Contract):
    index: int
    role: Literal["solo", "lead", "sibling"] = "solo"
    # A rescue whose agent runs in a sandbox worker (the definition routes each rescue on it;
    # a lane's steps are routed on `Lane.sandboxed`).
    sandboxed: bool = False
    # A sandboxed rescue's task CPU and memory for its `size:` (RunTask's overrides; sizes.py),
    # with `again` once its Catch sized it up (StepCrashedReport).
    task: dict[str, Any] = Field(default_factory=_default_task)


class LaneKey(NamedTuple):
    """A lane's identity: the agent and the model its steps share (so one prompt prefix).

    The state machine carries it as the text `agent@model` (`str()`); `parse` reads that
    back. The agent comes first and has no `@`, so a model name may have one."""

    agent: str
    model: str

    def __str__(self) -> str:
        return f"{self.agent}@{self.model}"

    @classmethod
    def parse(cls, key: str) -> LaneKey:
        agent, _, model = key.partition("@")
        return cls(agent, model)


class Lane(Contract):
    """The steps of a group that share one agent and one model (so one prompt prefix).

    `starters` start at once (a gated lane's lead, or every step of an ungated lane), at
    most `parallel` at a time; `siblings` wait for the lead's reply, at most
    `sibling_parallel` (= `parallel`) at a time, the one that would pass the cap while the
    lead runs waiting for its end (laneflow.domain.gate), so the lane never runs more than
    `parallel` at once.

    Steps are carried as their indexes only (the definition makes each Map item's step
    `{index, role}` from `starter_role`, or "sibling"): a window of a fan-out of 100,000
    stays a few kilobytes, and each Map iteration copies little."""

    key: str  # str(LaneKey): "<agent>@<model>"
    agent: str
    model: str
    parallel: int
    starters: list[int]
    siblings: list[int] = Field(default_factory=list)
    starter_role: Literal["solo", "lead"] = "solo"  # a gated lane's one starter is its lead
    sibling_parallel: int = 1
    # Its starter first waits for another run's writer of its prefix (WaitForPrefix): a gated
    # lane's lead, or a lone step; not the steps of an ungated lane (or with the gate off).
    prefix_wait: bool = False
    # Its agent runs in a sandbox worker: the definition runs the lane's steps through the
    # sandbox state (`ecs:runTask.waitForTaskToken`), not the RunStep function.
    sandboxed: bool = False
    # The CPU and memory of each of its sandbox tasks (RunTask's task overrides) for its
    # agent's `size:`, one up for each memory kill of the lane's steps (domain/sizes.py).
    task: dict[str, str] = Field(default_factory=_default_task)

    @property
    def steps(self) -> list[LaneStep]:
        return [LaneStep(index=i, role=self.starter_role) for i in self.starters] + [
            LaneStep(index=i, role="sibling") for i in self.siblings
        ]


class NextGroupRequest(Contract):
    run: DriveRef
    used: int = 0  # history events this execution has recorded so far (laneflow.domain.history)


class Plan(Contract):
    """NextGroup's answer: run a group, settle a group an earlier drive left unsettled (a
    failure, a leftover rescue), park for a person, end the run, or continue the run in a
    fresh execution."""

    action: Literal["run", "settle", "park", "end", "continue"]
    group: int = -1
    cycle: int = 0
    lanes: list[Lane] = Field(default_factory=list)
    reason: str | None = None
    # The window a `run` plan holds: the group's pending steps up to this index (-1: all
    # of them). A lane larger than what is left of the execution's history budget runs in
    # windows, later ones in later executions; SettleGroup settles the group after its last.
    through: int = -1
    used: int = 0  # history events this execution will have recorded once the plan has run


class OpContext(Contract):
    """Where an invocation comes from in the orchestrator: a re-delivered invocation presents
    the same values, so the same operation id (the claim journal's key)."""

    execution: str = ""
    state: str = ""
    map_index: int | None = None
    retry: int = 0

    def op_id(self, *, group: int, cycle: int, index: int) -> str:
        return f"{self.execution}|{self.state}|g{group}c{cycle}|s{index}|m{self.map_index}|r{self.retry}"


class RunStepRequest(Contract):
    run: DriveRef
    group: int
    cycle: int = 0
    lane: str = ""
    step: LaneStep
    op: OpContext = Field(default_factory=OpContext)
    # The gate a readied sibling's first request waits at (the embedded engine's early start;
    # laneflow.domain.lanes.gate_id), or None: the step starts as soon as it is called.
    hold: str | None = None


class WaitForLeadRequest(Contract):
    """A sibling's WaitForLead task: its callback token ($$.Task.Token) and its lane."""

    run: DriveRef
    group: int
    cycle: int = 0
    lane: str
    step: LaneStep
    token: str
    # Where it stands in its lane's siblings' Map, and the lane's cap: the iteration
    # `parallel - 1` holds the lead's pool slot (laneflow.domain.gate). Absent: not known.
    map_index: int | None = None
    parallel: int | None = None
    execution: str | None = None  # $$.Execution.Id: the embedded engine readies the sibling as RunSibling would start it


class WaitForLeadReport(Contract):
    index: int
    waiting: bool


class StepReport(Contract):
    index: int
    status: StepStatus
    attempts: int = 0


class StepCrashedRequest(Contract):
    run: DriveRef
    step: LaneStep
    group: int = -1
    cycle: int = 0
    lane: str = ""
    error: dict[str, Any] = Field(default_factory=dict)  # the Catch's {Error, Cause}
    # Set by a sandbox state's Catch, which starts the step again when the report says
    # `again`: a task stopped for memory (or evicted) below `large` leaves the step pending.
    size_up: bool = False


class StepCrashedReport(StepReport):
    """StepCrashed's answer: with `again`, the step is pending and the Catch runs it again in
    `task` (RunTask's cpu and memory overrides, one size up: domain/sizes.py)."""

    task: dict[str, str] = Field(default_factory=_default_task)
    again: bool = False


class SettleGroupRequest(Contract):
    run: DriveRef
    group: int
    cycle: int = 0
    through: int = -1  # the window that ran (Plan.through); -1: the whole group
    used: int = 0


class Settlement(Contract):
    """SettleGroup's answer: the next group, rescues to run first, a loop back to an
    earlier group (a new cycle), or the end of the run."""

    action: Literal["next", "rescue", "loop", "end", "continue"]
    reason: str | None = None
    rescues: list[LaneStep] = Field(default_factory=list)
    # Echoed for the definition, which keeps the settlement where the plan was (so the
    # plan's lanes are dropped once its group has run): the group, its window, and the
    # history events used (the rescues to run counted in).
    group: int = -1
    cycle: int = 0
    through: int = -1
    used: int = 0


class NextDriveRequest(Contract):
    """NextDrive: this execution's history is spent; the drive goes on in a fresh one."""

    run: DriveRef
    execution: str = ""  # $$.Execution.Id of the execution that ends


class DriveContinued(Contract):
    run_id: str
    execution: str | None  # the fresh execution (None: the run had ended, nothing started)
    segment: int


class ParkRequest(Contract):
    run: DriveRef
    group: int


class EndRunRequest(Contract):
    run: DriveRef


class RunEnded(Contract):
    run_id: str
    status: RunStatus
