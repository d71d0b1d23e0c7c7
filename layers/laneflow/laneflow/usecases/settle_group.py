"""Flow control when a group has run (DESIGN section 3): rescues, evaluator loops, budgets.

`settle` is what SettleGroup decides, in this order:
1. a stop ends the run;
2. finished rescues are applied to the steps they took over (a rescued step carries its
   rescue's result; a rescue's failure is recorded on the step it took over);
3. a step nothing worked on any more is recorded as failed;
4. evaluator loops: a completed `until:` step whose reply does not end with its marker
   resets the steps from the `loop:` agent's group through its own to pending (a new
   cycle), or, past `max_cycles`, fails;
5. failures: a failed required step with `on_fail` gets one rescue per failure (across
   drives: a leftover pending rescue is picked up, extra unfinished copies are skipped);
   a required flow step that ends failed fails the run; an optional one does not.
"""

from __future__ import annotations

from laneflow.domain.errors import AttemptEnded, Conflict
from laneflow.domain.flow import Flow, StepSpec
from laneflow.domain.messages import (
    DriveRef,
    LaneStep,
    SettleGroupRequest,
    Settlement,
    StepCrashedRequest,
)
from laneflow.domain.records import (
    AttemptRef,
    AttemptStatus,
    Event,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
)
from laneflow.domain.settlement import (
    STOPPED,
    SUPERSEDED,
    budget_spent,
    ends_with_marker,
    loop_target_group,
    rescue_instruction,
)
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.ports import Services
from laneflow.usecases.run_step.handoff import feedback_key
from laneflow.usecases.start_run import resolve_model, run_account


def settle_group(svc: Services, req: SettleGroupRequest) -> Settlement:
    """What a finished group means for the run (control.py): the next group, rescues,
    a loop back, or the end (its reason kept on the run)."""
    run = svc.store.get_run(req.run.tenant, req.run.run_id, steps=False)
    # The run's cost is settled once per group (steps carry their own as they end).
    spent = round(sum(s.cost_usd for s in svc.store.get_steps(run.tenant, run.id)), 6)
    if spent != run.cost_usd:
        try:
            run = svc.store.update_run(run.tenant, run.id, RunChanges(cost_usd=spent), expect_status=(RunStatus.running,))
        except Conflict:
            pass
    settled = Settler(svc, run, req.group).settle()
    if settled.action == "end" and settled.reason and settled.reason != STOPPED:
        try:
            svc.store.update_run(run.tenant, run.id, RunChanges(error=settled.reason), expect_status=(RunStatus.running,))
        except Conflict:
            pass
    return settled



def _event(svc: Services, run: Run, index: int, text: str, type: str = "info") -> None:
    svc.store.add_event(run.tenant, run.id, index, Event(type=type, text=text))



class Settler:
    def __init__(self, svc: Services, run: Run, group: int):
        self.svc, self.run, self.group = svc, run, group
        self.store = svc.store
        self.flow = Flow.model_validate(run.flow_spec)

    def steps(self) -> list[Step]:
        return self.store.get_steps(self.run.tenant, self.run.id, group=self.group)

    def settle(self) -> Settlement:
        if self.run.stop_requested:
            return Settlement(action="end", reason=STOPPED)
        self.apply_finished_rescues()
        self.record_abandoned()
        looped = self.check_loops()
        if looped:
            return looped
        return self.handle_failures()

    # -- 2. rescues that ended ------------------------------------------------------------

    def apply_finished_rescues(self) -> None:
        steps = self.steps()
        by_index = {s.index: s for s in steps}
        for rescue in steps:
            if rescue.rescue_of is None or not rescue.status.ended or rescue.status == StepStatus.skipped:
                continue
            target = by_index.get(rescue.rescue_of)
            if target is None or target.status != StepStatus.failed or target.cycle != rescue.cycle:
                continue
            if rescue.status == StepStatus.completed:
                self.store.update_step(
                    self.run.tenant, self.run.id, target.index,
                    StepChanges(status=StepStatus.completed, result=rescue.result, conclusion=rescue.conclusion,
                                data=rescue.data, error=None, finished_at=rescue.finished_at),
                    expect_status=(StepStatus.failed,),
                )
                _event(self.svc, self.run, target.index, f"rescued by step {rescue.index} ({rescue.agent}); it failed: {target.error}")
            else:
                note = f"its rescue (step {rescue.index}, {rescue.agent}) failed too"
                if note not in (target.error or ""):
                    self.store.update_step(
                        self.run.tenant, self.run.id, target.index,
                        StepChanges(error=f"{target.error}; {note}: {rescue.error}"),
                        expect_status=(StepStatus.failed,),
                    )

    # -- 3. steps nothing works on any more ---------------------------------------------

    def record_abandoned(self) -> None:
        from laneflow.usecases.step_crashed import (
            step_crashed,  # the same ending a crashed worker gets
        )

        for step in self.steps():
            if step.rescue_of is None and step.status in (StepStatus.pending, StepStatus.running):
                step_crashed(
                    self.svc,
                    StepCrashedRequest(
                        run=DriveRef(tenant=self.run.tenant, run_id=self.run.id),
                        step=LaneStep(index=step.index),
                        error={"Error": "NotRun", "Cause": "the group ended before this step finished"},
                    ),
                )

    # -- 4. evaluator loops -------------------------------------------------------------

    def check_loops(self) -> Settlement | None:
        for step in self.steps():
            if step.rescue_of is not None or step.status != StepStatus.completed:
                continue
            spec = self.flow.spec(step.entry, step.slot)
            if not spec.until or not spec.loop or ends_with_marker(step.conclusion or step.result, spec.until):
                continue
            max_cycles = spec.max_cycles or 3
            if step.cycle + 1 >= max_cycles:
                reason = f"its reply did not end with {spec.until} after {max_cycles} cycle(s)"
                self.store.update_step(
                    self.run.tenant, self.run.id, step.index, StepChanges(status=StepStatus.failed, error=reason),
                    expect_status=(StepStatus.completed,),
                )
                _event(self.svc, self.run, step.index, reason, type="error")
                continue
            return self.reset_cycle(step, spec)
        return None

    def reset_cycle(self, checker: Step, spec: StepSpec) -> Settlement:
        target = loop_target_group(self.flow, checker, spec.loop or "")
        cycle = checker.cycle + 1
        cleared = StepChanges(status=StepStatus.pending, cycle=cycle, result=None, conclusion=None, data=None,
                              error=None, skip_reason=None, started_at=None, finished_at=None)
        for step in self.store.get_steps(self.run.tenant, self.run.id):
            if step.rescue_of is None and target <= step.group <= checker.group:
                self.store.update_step(self.run.tenant, self.run.id, step.index, cleared)
        verdict = (checker.conclusion or checker.result or "").strip()
        note = f"## What {checker.agent} said about the last cycle (it did not end with {spec.until})\n\n{verdict}"
        self.store.put_handoff(self.run.tenant, self.run.id, feedback_key(target, cycle), note)
        text = f"loop: no {spec.until} at the end of the reply; cycle {cycle + 1} of {spec.max_cycles or 3} from group {target}"
        _event(self.svc, self.run, checker.index, text)
        return Settlement(action="loop", reason=text)

    # -- 5. failures: rescues, or the end of the run ------------------------------------

    def handle_failures(self) -> Settlement:
        steps = self.steps()
        rescues = [s for s in steps if s.rescue_of is not None]
        launch: list[LaneStep] = []
        failed: list[Step] = []
        for step in steps:
            if step.rescue_of is not None or step.status != StepStatus.failed or step.optional:
                continue
            spec = self.flow.spec(step.entry, step.slot)
            mine = [r for r in rescues if r.rescue_of == step.index and r.cycle == step.cycle]
            if not spec.on_fail or any(r.status in (StepStatus.completed, StepStatus.failed) for r in mine):
                failed.append(step)  # no rescue, or its one rescue already ended without saving it
                continue
            unfinished = sorted((r for r in mine if r.status in (StepStatus.pending, StepStatus.running)), key=lambda r: r.index)
            for extra in unfinished[1:]:
                self._supersede(extra)
            if unfinished:
                keep = self._resume(unfinished[0])
            else:
                keep = self._new_rescue(step, spec)
            if keep.status == StepStatus.pending:
                launch.append(LaneStep(index=keep.index))
        if launch:
            if self.budget_spent():
                return Settlement(action="end", reason=self.budget_spent())
            return Settlement(action="rescue", rescues=launch)
        if failed:
            first = failed[0]
            item = f" ({first.item})" if first.item is not None and not isinstance(first.item, (dict, list)) else ""
            reason = f"step {first.index} ({first.agent}{item}) failed: {first.error or 'no reason recorded'}"
            if len(failed) > 1:
                reason += f" (and {len(failed) - 1} more)"
            return Settlement(action="end", reason=reason)
        return Settlement(action="next")

    def _resume(self, rescue: Step) -> Step:
        """A leftover rescue still marked running when its group is settled: nothing in this
        drive works on it (the group's Map has ended), so its attempt is ended as
        interrupted, by its exact identity, and the rescue runs again."""
        if rescue.status != StepStatus.running:
            return rescue
        for attempt in self.store.list_attempts(self.run.tenant, self.run.id, rescue.index):
            if attempt.status == AttemptStatus.running:
                try:
                    self.store.end_attempt(
                        AttemptRef.of(self.run.tenant, attempt), AttemptStatus.interrupted,
                        reason="interrupted: its worker went away", step=StepChanges(status=StepStatus.pending),
                    )
                except AttemptEnded:
                    pass
        step = self.store.get_step(self.run.tenant, self.run.id, rescue.index)
        if step.status == StepStatus.running:  # no running attempt was left: just pending again
            step = self.store.update_step(self.run.tenant, self.run.id, rescue.index, StepChanges(status=StepStatus.pending), expect_status=(StepStatus.running,))
        return step

    def _supersede(self, rescue: Step) -> None:
        try:
            self.store.update_step(
                self.run.tenant, self.run.id, rescue.index, StepChanges(status=StepStatus.skipped, skip_reason=SUPERSEDED),
                expect_status=(StepStatus.pending, StepStatus.running),
            )
        except Conflict:
            pass

    def _new_rescue(self, step: Step, spec: StepSpec) -> Step:
        agent = spec.on_fail or ""
        ws = load_workspace(self.svc.folders.open(self.run.workspace_uri), run_account(self.run))
        agent_model = load_agent(ws, agent).settings.model
        rescue_spec = spec.model_copy(update={"model": None})
        model = resolve_model(rescue_spec, agent_model, ws, override=self.run.model, default=self.svc.settings.default_model)
        index = max(s.index for s in self.store.get_steps(self.run.tenant, self.run.id)) + 1
        rescue = Step(
            index=index, group=step.group, entry=step.entry, slot=step.slot, agent=agent, item=step.item, model=model,
            cycle=step.cycle, rescue_of=step.index, instruction=rescue_instruction(step, spec, step.error),
        )
        self.store.add_steps(self.run.tenant, self.run.id, [rescue])
        _event(self.svc, self.run, step.index, f"rescue: {agent} takes this step over as step {index}")
        return rescue

    def budget_spent(self) -> str | None:
        spent = sum(s.cost_usd for s in self.store.get_steps(self.run.tenant, self.run.id))
        return budget_spent(self.run, spent)
