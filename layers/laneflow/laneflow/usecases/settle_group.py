"""Flow control when a group has run (README, "Flow control"): rescues, evaluator loops, budgets.

SettleGroup reads the run, the group's steps and the run's group outline (never every step
of the run), and writes what the rules of `laneflow.domain.settlement` say, in this order:
1. a stop ends the run (nothing else is written);
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
from laneflow.domain.flow import Flow
from laneflow.domain.history import history_costs
from laneflow.domain.lanes import sandboxed_agents
from laneflow.domain.messages import (
    DriveRef,
    LaneStep,
    SettleGroupRequest,
    Settlement,
    StepCrashedRequest,
)
from laneflow.domain.outline import UNFINISHED, GroupOutline, StepFilter, statuses
from laneflow.domain.outline import saved as saved_of
from laneflow.domain.outline import spent as spent_of
from laneflow.domain.records import (
    AttemptRef,
    AttemptStatus,
    Event,
    EventType,
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
    Decision,
    NewRescue,
    RescuePlan,
    Tidying,
    decide,
    loop_target_group,
    tidy,
)
from laneflow.domain.sizes import run_sizes, task_overrides
from laneflow.domain.windows import rescue_window, within
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.ports import Services
from laneflow.usecases.run_step.handoff import feedback_key
from laneflow.usecases.start_run import resolve_model, run_account


def settle_group(svc: Services, req: SettleGroupRequest) -> Settlement:
    """What a finished group means for the run: the next group, rescues, a loop back, or
    the end (its reason kept on the run)."""
    run = svc.store.get_run(req.run.tenant, req.run.run_id, steps=False)
    settled = Settler(svc, run, req.group, through=req.through).settle()
    if settled.action == "end" and settled.reason and settled.reason != STOPPED:
        try:
            svc.store.update_run(run.tenant, run.id, RunChanges(error=settled.reason), expect_status=(RunStatus.running,))
        except Conflict:
            pass
    echo = {"group": req.group, "cycle": req.cycle, "through": req.through, "used": req.used}
    if settled.action != "rescue":
        return settled.model_copy(update=echo)
    # Rescues run as many as fit this execution's history; the others stay pending, and the
    # group is settled again after these (here, or in a fresh execution: `continue`).
    costs = history_costs()
    taken, used = rescue_window(
        settled.rescues, used=req.used, budget=svc.settings.history_budget, costs=costs, fresh=req.used <= costs.group
    )
    if not taken:
        return settled.model_copy(update={**echo, "action": "continue", "rescues": []})
    return settled.model_copy(update={**echo, "rescues": taken, "used": used})


class Settler:
    """Writes a group's settlement: what `tidy` says to record, then what `decide` says
    the group means, each write conditional on what the rules read."""

    def __init__(self, svc: Services, run: Run, group: int, *, through: int = -1):
        self.svc, self.run, self.group = svc, run, group
        self.through = through  # the window that ran (-1: the whole group)
        self.store = svc.store
        self.flow = Flow.model_validate(run.flow_spec)
        self.loops = any(spec.until for entry in self.flow.entries for spec in entry.steps)

    def settle(self) -> Settlement:
        """Only what the decision needs is read: after a window that is not the group's last,
        the window's steps still pending or running (what tidying records) and whether a later
        window is left; after the last, the group's steps the decision can turn on (again only
        if tidying wrote to them: its rescues and the flow steps that did not complete, or,
        in a flow with `until:` steps, all of them), the run's group outline (its cost, its
        last index), and the steps of the groups an `until:` step of this group loops back
        to. Never every step of the run, nor a large group's completed steps."""
        tenant, run_id = self.run.tenant, self.run.id
        if self.run.stop_requested:  # nothing else is read or written for a stopped run
            self.settle_cost(self.store.get_group_outline(tenant, run_id))
            return Settlement(action="end", reason=STOPPED)
        if self.through >= 0 and (later := self._later_window()):
            return later
        # A flow with no `until:` step is settled on the group's rescues and its flow steps that
        # did not complete (nothing else can fail it, loop it or be rescued); one with loops
        # on the whole group, whose steps a loop resets.
        where = None if self.loops else StepFilter(settling=True)
        members = self.store.get_steps(tenant, run_id, group=self.group, messages=False, where=where)
        tidying = tidy(self.run, within(members, self.through))
        self.apply_tidying(tidying)
        outline = self.store.get_group_outline(tenant, run_id)
        self.settle_cost(outline)
        if tidying.rescued or tidying.rescue_failed or tidying.abandoned:  # what it recorded is read back
            members = self.store.get_steps(tenant, run_id, group=self.group, messages=False, where=where)
        steps = [
            s for g in self._looped_to(members) for s in self.store.get_steps(tenant, run_id, group=g, messages=False)
        ] + members
        last = max((o.last_index for o in outline), default=-1)
        return self.apply(decide(self.run, self.flow, self.group, steps, next_index=last + 1, spent=spent_of(outline)))

    def _later_window(self) -> Settlement | None:
        """`next` when the group has pending flow steps after this window's last (`through`),
        once the window's steps nothing works on are recorded; None when this window was the
        group's last. No rescue of this cycle exists before its last window is settled, so the
        window's own steps are all tidying has to look at."""
        tenant, run_id = self.run.tenant, self.run.id
        later = self.store.get_steps(
            tenant,
            run_id,
            group=self.group,
            messages=False,
            where=StepFilter(statuses=statuses(StepStatus.pending), flow=True, low=self.through + 1, limit=1),
        )
        if not later:
            return None
        unfinished = self.store.get_steps(
            tenant, run_id, group=self.group, messages=False, where=StepFilter(statuses=UNFINISHED, flow=True, high=self.through)
        )
        self.apply_tidying(tidy(self.run, unfinished))
        outline = self.store.get_group_outline(tenant, run_id)
        self.settle_cost(outline)
        left = next((o.pending for o in outline if o.group == self.group), 0)
        return Settlement(action="next", reason=f"{left} step(s) of group {self.group} still to run")

    def _looped_to(self, members: list[Step]) -> list[int]:
        """The earlier groups this group's completed `until:` steps may loop back to (their
        steps are reset with a loop)."""
        targets = set()
        for step in members:
            spec = self.flow.spec(step.entry, step.slot) if step.rescue_of is None else None
            if spec is not None and spec.until and spec.loop and step.status == StepStatus.completed:
                targets.add(loop_target_group(self.flow, step, spec.loop))
        return list(range(min(targets), self.group)) if targets else []

    def settle_cost(self, outline: list[GroupOutline]) -> None:
        """The run's cost and savings are settled once per group, as the sums of its steps'
        (each step carries its own as it ends)."""
        spent, saved = spent_of(outline), saved_of(outline)
        if spent == self.run.cost_usd and saved == self.run.savings_usd:
            return
        try:
            self.run = self.store.update_run(
                self.run.tenant, self.run.id, RunChanges(cost_usd=spent, savings_usd=saved), expect_status=(RunStatus.running,)
            )
        except Conflict:
            pass

    def _event(self, index: int, text: str, type: EventType = EventType.info) -> None:
        self.store.add_event(self.run.tenant, self.run.id, index, Event(type=type, text=text))

    # -- 2, 3. what is recorded first ------------------------------------------------------

    def apply_tidying(self, tidying: Tidying) -> None:
        tenant, run_id = self.run.tenant, self.run.id
        for target, rescue in tidying.rescued:
            self.store.update_step(
                tenant,
                run_id,
                target.index,
                StepChanges(
                    status=StepStatus.completed,
                    result=rescue.result,
                    conclusion=rescue.conclusion,
                    data=rescue.data,
                    error=None,
                    finished_at=rescue.finished_at,
                ),
                expect_status=(StepStatus.failed,),
            )
            self._event(target.index, f"rescued by step {rescue.index} ({rescue.agent}); it failed: {target.error}")
        for target, error in tidying.rescue_failed:
            self.store.update_step(tenant, run_id, target.index, StepChanges(error=error), expect_status=(StepStatus.failed,))
        if tidying.abandoned:
            from laneflow.usecases.step_crashed import (
                step_crashed,  # the same ending a crashed worker gets
            )

            for index in tidying.abandoned:
                step_crashed(
                    self.svc,
                    StepCrashedRequest(
                        run=DriveRef(tenant=tenant, run_id=run_id),
                        step=LaneStep(index=index),
                        error={"Error": "NotRun", "Cause": "the group ended before this step finished"},
                    ),
                )

    # -- 4, 5. what the group means ----------------------------------------------------------

    def apply(self, decision: Decision) -> Settlement:
        tenant, run_id = self.run.tenant, self.run.id
        for ended in decision.exhausted:
            self.store.update_step(
                tenant,
                run_id,
                ended.index,
                StepChanges(status=StepStatus.failed, error=ended.reason),
                expect_status=(StepStatus.completed,),
            )
            self._event(ended.index, ended.reason, type=EventType.error)
        if decision.loop is not None:
            loop = decision.loop
            cleared = StepChanges(
                status=StepStatus.pending,
                cycle=loop.cycle,
                result=None,
                conclusion=None,
                data=None,
                error=None,
                skip_reason=None,
                started_at=None,
                finished_at=None,
            )
            for index in loop.reset:
                self.store.update_step(tenant, run_id, index, cleared)
            self.store.put_handoff(tenant, run_id, feedback_key(loop.group, loop.cycle), loop.feedback)
            self._event(loop.checker, decision.reason or "")
            return Settlement(action="loop", reason=decision.reason)
        launched = [launch for plan in decision.rescues if (launch := self._rescue(plan)) is not None]
        if decision.rescues and not launched:  # every rescue kept had ended meanwhile
            return Settlement(action="end", reason=decision.unrescued) if decision.unrescued else Settlement(action="next")
        return Settlement(action=decision.action, reason=decision.reason, rescues=launched if decision.action == "rescue" else [])

    def _rescue(self, plan: RescuePlan) -> LaneStep | None:
        """Write one failed step's rescue; the rescue to launch, if it is pending."""
        for index in plan.supersede:
            self._supersede(index)
        keep = self._resume(plan.resume) if plan.resume is not None else self._new_rescue(plan.new)  # type: ignore[arg-type]
        if keep.status != StepStatus.pending:
            return None
        agent = keep.agent or ""
        task = task_overrides(run_sizes(self.run.options).get(agent))  # its agent's size: a rescue is a new step
        return LaneStep(index=keep.index, sandboxed=agent in sandboxed_agents(self.run.options), task=task)

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
                        AttemptRef.of(self.run.tenant, attempt),
                        AttemptStatus.interrupted,
                        reason="interrupted: its worker went away",
                        step=StepChanges(status=StepStatus.pending),
                    )
                except AttemptEnded:
                    pass
        step = self.store.get_step(self.run.tenant, self.run.id, rescue.index)
        if step.status == StepStatus.running:  # no running attempt was left: just pending again
            step = self.store.update_step(
                self.run.tenant,
                self.run.id,
                rescue.index,
                StepChanges(status=StepStatus.pending),
                expect_status=(StepStatus.running,),
            )
        return step

    def _supersede(self, index: int) -> None:
        try:
            self.store.update_step(
                self.run.tenant,
                self.run.id,
                index,
                StepChanges(status=StepStatus.skipped, skip_reason=SUPERSEDED),
                expect_status=(StepStatus.pending, StepStatus.running),
            )
        except Conflict:
            pass

    def _new_rescue(self, new: NewRescue) -> Step:
        """Add the rescue step, its model resolved as a flow step's would be (the workspace
        and the rescuing agent read now), its own `model:` aside."""
        ws = load_workspace(self.svc.folders.open(self.run.workspace_uri), run_account(self.run))
        agent_model = load_agent(ws, new.agent).settings.model
        rescue_spec = new.spec.model_copy(update={"model": None})
        model = resolve_model(rescue_spec, agent_model, ws, override=self.run.model, default=self.svc.settings.default_model)
        step = new.of
        rescue = Step(
            index=new.index,
            group=step.group,
            entry=step.entry,
            slot=step.slot,
            agent=new.agent,
            item=step.item,
            model=model,
            cycle=step.cycle,
            rescue_of=step.index,
            instruction=new.instruction,
        )
        self.store.add_steps(self.run.tenant, self.run.id, [rescue])
        self._event(step.index, f"rescue: {new.agent} takes this step over as step {new.index}")
        return rescue
