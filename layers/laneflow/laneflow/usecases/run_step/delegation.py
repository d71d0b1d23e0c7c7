"""A step's delegates (agent.md `delegates:`; the rules are laneflow.domain.delegation): a
`delegate` call runs the named agent's own model loop inside the calling attempt, with its
own prompt layers, model, tools, stub answers and secrets, and its final reply is the call's
result.

Everything a delegate does is the step's: its model calls are spans of the step marked with
its name (`ModelCall.delegate`), its tool calls and trace lines carry `"delegate": NAME`, its
cost is the step's and the run's (so their budgets bind it), and a stop ends it with the
step. Its secrets are loaded for its own loop and removed when it answers, masked under the
run's scope like the step's own. A delegate's failure (its stub's `fail:`, a refused setting)
is the call's `is_error` result, so the caller can go on; a stop, or the budget spent, ends
the step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from laneflow.domain.delegation import DelegationRefused, refusal
from laneflow.domain.errors import StepFailed, StepStopped, WorkspaceInvalid
from laneflow.domain.prompt import SystemPrompt, build_system_prompt
from laneflow.domain.records import EventType, ModelCall, Run
from laneflow.domain.workspace import Agent, Workspace, load_agent
from laneflow.ports import Services, StepInbox, StepJob
from laneflow.usecases.run_step.delegate_gate import DelegateGate, delegate_gate_key
from laneflow.usecases.run_step.job import agent_fields
from laneflow.usecases.run_step.recorder import StepRecorder
from laneflow.usecases.run_step.secrets import load_secrets

SHOWN_TASK_CHARS = 200  # of a task, in the trace line that says it was delegated


@dataclass
class DelegateSink:
    """The `ExecutionSink` of a delegate's loop: the step's recorder, with the delegate's
    name on every span, tool call and trace line. Its first event opens no gate (the step's
    own reply began before it could delegate)."""

    recorder: StepRecorder
    name: str
    delegator: Delegation | None = None
    inbox: StepInbox | None = None  # a delegate hears no colleagues: the step does
    spent: bool = False  # the run's or the step's budget refused a turn
    gate: DelegateGate | None = None  # its prefix's gate, opened by its first event if it leads

    def first_event(self) -> None:
        if self.gate is not None:
            self.gate.open()

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None:
        if self.gate is not None:  # nothing to wait for: none of it will be cached
            self.gate.open()

    def begin_turn(self) -> None:
        try:
            self.recorder.begin_turn()
        except StepFailed:
            self.spent = True
            raise

    def call(self, span: ModelCall) -> ModelCall:
        return self.recorder.call(span.model_copy(update={"delegate": self.name}))

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        self.recorder.event(type, f"[{self.name}] {text}", {**(data or {}), "delegate": self.name})

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        self.recorder.tool_call(name, tool_input, tool_output, ms=ms, is_error=is_error, delegate=self.name)

    def stopped(self) -> bool:
        return self.recorder.stopped()


@dataclass
class Delegation:
    """The `Delegator` of one level of a step's attempt: `chain` is the agents from the
    step's own down to the one that calls (`granted`: its `delegates:`)."""

    svc: Services
    run: Run
    ws: Workspace
    recorder: StepRecorder
    caller: StepJob  # the calling loop's job: what a delegate's job inherits (run, step, size, budget)
    chain: tuple[str, ...]
    granted: tuple[str, ...]
    _calls: Counter[str] = field(default_factory=Counter)

    def delegate(self, agent: str, task: str) -> str:
        why = refusal(self.chain, agent, self.granted)
        if why:
            raise DelegationRefused(why)
        try:
            target = load_agent(self.ws, agent)
        except WorkspaceInvalid as invalid:
            raise DelegationRefused(f"{agent} cannot be read: {invalid}") from None
        if target.sandboxed and not self.svc.sandbox:
            raise DelegationRefused(
                f"{agent} runs programs, and this step is not in a sandbox (were its agents changed after the run started?)"
            )
        sink = DelegateSink(self.recorder, agent)
        secrets = None
        answer_index = self._calls[agent]
        self._calls[agent] += 1
        try:
            secrets = load_secrets(self.svc, self.run, target, sink)
            prompt = build_system_prompt(self.ws, target)
            job = self._job(target, task, answer_index, prompt, dict(secrets.env))
            sink.delegator = (
                Delegation(
                    self.svc, self.run, self.ws, self.recorder, job, (*self.chain, agent), tuple(target.settings.delegates)
                )
                if target.settings.delegates
                else None
            )
            shown = task if len(task) <= SHOWN_TASK_CHARS else task[:SHOWN_TASK_CHARS] + "…"
            self.recorder.event(
                EventType.info,
                f"{self.chain[-1]} delegated to {agent} ({job.model}): {shown}",
                {"delegate": agent, "depth": len(self.chain), "model": job.model},
            )
            before = self.recorder.cost_usd
            names = [str(d.get("name", "")) for d in self.svc.tool_definitions(job)] if self.svc.tool_definitions else []
            sink.gate = DelegateGate(self.svc, job, delegate_gate_key(job, names))
            sink.gate.enter(sink)
            outcome = self.svc.executor(job.model).execute(job, sink)
        except StepStopped:
            raise
        except StepFailed as failed:
            if sink.spent:
                raise
            raise DelegationRefused(f"{agent} failed: {failed}") from None
        finally:
            if sink.gate is not None:
                sink.gate.open(ended=True)
            if secrets is not None:
                secrets.close()
        spent = round(self.recorder.cost_usd - before, 6)
        self.recorder.event(
            EventType.info,
            f"{agent} answered {self.chain[-1]} after {outcome.turns} turn(s), ${spent:.4f}",
            {"delegate": agent, "turns": outcome.turns, "cost_usd": spent},
        )
        return outcome.conclusion or outcome.result

    def _job(self, target: Agent, task: str, answer_index: int, prompt: SystemPrompt, secret_env: dict[str, str]) -> StepJob:
        caller, settings = self.caller, target.settings
        model = self.run.model or settings.model or self.ws.settings.model or self.svc.settings.default_model
        budget = caller.budget
        if budget is not None:  # what is left of the step's budget bounds its delegates too
            budget = max(0.0, round(budget - self.recorder.cost_usd, 6))
        if settings.budget is not None:
            budget = settings.budget if budget is None else min(budget, settings.budget)
        return StepJob(
            tenant=caller.tenant,
            run_id=caller.run_id,
            index=caller.index,
            attempt=caller.attempt,
            agent=target.name,
            model=model,
            item=caller.item,
            run_input=caller.run_input,
            system_stable=prompt.stable,
            system_dynamic=prompt.dynamic,
            user=task,
            workspace_root=caller.workspace_root,
            answer_index=answer_index,
            budget=budget,
            size=caller.size,  # the step's sandbox is the delegate's too
            network_enforce=caller.network_enforce,
            sandboxed=caller.sandboxed,
            secret_env=secret_env,
            **agent_fields(target),  # its own tools, answers, limits, servers and network
        )
