"""What an executor is given and what it reports through.

An executor runs one attempt of one step: it receives a `StepJob` (the assembled prompt and
limits) and reports everything it does through an `ExecutionSink` (the first stream event,
model-call spans, tool calls, trace lines). It returns a `StepOutcome`, or raises
`StepFailed`. It never touches the store: the sink does, fenced by the attempt's identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..models import ModelCall


@dataclass(frozen=True)
class StepJob:
    tenant: str
    run_id: str
    index: int
    attempt: int  # this attempt's number (1-based, counted across loop cycles)
    agent: str
    model: str
    item: Any
    run_input: Any
    system_stable: str  # the cached part of the system prompt
    system_dynamic: str  # what changes between runs, after the cache breakpoint
    user: str  # the instruction, the handoff block and what earlier attempts taught
    tools: tuple[str, ...] = ()
    workspace_root: str = ""  # where the step's file tools may reach (never sent to the model)
    agent_path: str = ""  # the agent's folder, relative to the workspace
    stub: str | list[str] | None = None
    answer_index: int = 0  # which stub answer: attempts at this step position so far
    max_turns: int | None = None
    timeout: float | None = None
    budget: float | None = None


@dataclass
class StepOutcome:
    result: str  # the whole reply (every turn's text)
    conclusion: str  # the final turn's text
    cost_usd: float = 0.0
    turns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class ExecutionSink(Protocol):
    """Where an executor reports. Every method is a fenced write about this attempt."""

    def first_event(self) -> None:
        """The model's response has begun (the stream's first event): opens the warm gate."""

    def call(self, span: ModelCall) -> ModelCall:
        """Record (or update, same id) a model-call span. The sink numbers it across the
        step's attempts and returns it as stored."""

    def event(self, type: str, text: str, data: dict[str, Any] | None = None) -> None:
        """Append a trace line."""

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0) -> None:
        """Record a tool call: a tool event and, unless capture is off, its input and output."""

    def stopped(self) -> bool:
        """True when the run was stopped: the executor ends the attempt as soon as it can."""


class Executor(Protocol):
    name: str

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome: ...
