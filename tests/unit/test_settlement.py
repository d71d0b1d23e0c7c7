"""A group's settlement decided from what the store read, without a store: `tidy` (what is
recorded first) and `decide` (what the group means), one test per outcome."""

from __future__ import annotations

from typing import Any

from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.records import Run, Step, StepStatus
from laneflow.domain.settlement import STOPPED, decide, tidy


def flow(*entries: list[StepSpec]) -> Flow:
    return Flow(
        name="f",
        path="flows/f.yaml",
        entries=[Entry(index=i, kind="steps", steps=specs) for i, specs in enumerate(entries)],
    )


def run(**fields: Any) -> Run:
    return Run(id="run-1", workspace="ws", flow="f", status="running", **fields)  # type: ignore[arg-type]


def step(index: int, status: StepStatus, *, group: int = 0, entry: int = 0, slot: int = 0, **fields: Any) -> Step:
    return Step(index=index, group=group, entry=entry, slot=slot, status=status, agent=fields.pop("agent", "writer"), **fields)


WRITE = [StepSpec(agent="writer")]
RESCUED = [StepSpec(agent="writer", on_fail="fixer")]
LOOP = flow([StepSpec(agent="writer")], [StepSpec(agent="checker", until="OK", loop="writer", max_cycles=3)])


# --------------------------------------------------------------------------- decide


def test_a_group_whose_steps_all_completed_goes_on_to_the_next() -> None:
    decision = decide(run(), flow(WRITE), 0, [step(0, StepStatus.completed)])
    assert (decision.action, decision.reason, decision.rescues, decision.loop) == ("next", None, (), None)


def test_a_stop_ends_the_run_whatever_the_steps_say() -> None:
    decision = decide(run(stop_requested=True), flow(WRITE), 0, [step(0, StepStatus.failed, error="broke")])
    assert (decision.action, decision.reason) == ("end", STOPPED)


def test_a_required_failure_ends_the_run_naming_the_first_and_counting_the_rest() -> None:
    steps = [step(0, StepStatus.failed, item="tides", error="broke"), step(1, StepStatus.failed, error="also")]
    decision = decide(run(), flow(WRITE), 0, steps)
    assert decision.action == "end"
    assert decision.reason == "step 0 (writer (tides)) failed: broke (and 1 more)"


def test_an_optional_failure_does_not_end_the_run() -> None:
    decision = decide(run(), flow(WRITE), 0, [step(0, StepStatus.failed, optional=True, error="broke")])
    assert decision.action == "next"


def test_a_failure_with_on_fail_gets_a_new_rescue_as_the_next_step_index() -> None:
    steps = [step(0, StepStatus.failed, error="broke"), step(1, StepStatus.completed, group=1, entry=1)]
    decision = decide(run(), flow(RESCUED, WRITE), 0, steps)
    assert decision.action == "rescue"
    [plan] = decision.rescues
    assert plan.of == 0 and plan.resume is None and plan.supersede == ()
    assert plan.new is not None
    assert (plan.new.index, plan.new.agent, plan.new.of.index) == (2, "fixer", 0)
    assert "failed: broke" in plan.new.instruction
    assert decision.unrescued is None  # a step its rescue may still save ends nothing


def test_a_leftover_rescue_is_resumed_and_its_extra_copies_superseded() -> None:
    steps = [
        step(0, StepStatus.failed, error="broke"),
        step(1, StepStatus.running, agent="fixer", rescue_of=0),
        step(2, StepStatus.pending, agent="fixer", rescue_of=0),
    ]
    decision = decide(run(), flow(RESCUED), 0, steps)
    [plan] = decision.rescues
    assert decision.action == "rescue"
    assert plan.resume is not None and (plan.resume.index, plan.supersede, plan.new) == (1, (2,), None)


def test_a_rescue_that_already_failed_leaves_the_step_failed_and_ends_the_run() -> None:
    steps = [step(0, StepStatus.failed, error="broke"), step(1, StepStatus.failed, agent="fixer", rescue_of=0)]
    decision = decide(run(), flow(RESCUED), 0, steps)
    assert (decision.action, decision.reason, decision.rescues) == ("end", "step 0 (writer) failed: broke", ())


def test_a_spent_budget_ends_the_run_instead_of_launching_a_rescue() -> None:
    steps = [step(0, StepStatus.failed, error="broke", cost_usd=0.75)]
    decision = decide(run(options={"budget": 0.5}), flow(RESCUED), 0, steps)
    assert decision.action == "end"
    assert decision.reason == "budget spent: $0.7500 of $0.50"
    assert len(decision.rescues) == 1  # still written, as before: the run ends with it pending


def test_a_reply_without_the_marker_loops_back_to_the_loop_agents_group() -> None:
    steps = [
        step(0, StepStatus.completed, result="draft"),
        step(1, StepStatus.completed, group=1, entry=1, agent="checker", conclusion="Needs work."),
        step(2, StepStatus.pending, group=2, entry=2),
    ]
    decision = decide(run(), LOOP, 1, steps)
    assert decision.action == "loop"
    assert decision.reason == "loop: no OK at the end of the reply; cycle 2 of 3 from group 0"
    loop = decision.loop
    assert loop is not None
    assert (loop.checker, loop.group, loop.cycle, loop.reset) == (1, 0, 1, (0, 1))
    assert loop.feedback.endswith("Needs work.") and "did not end with OK" in loop.feedback


def test_a_reply_with_the_marker_goes_on() -> None:
    steps = [
        step(0, StepStatus.completed),
        step(1, StepStatus.completed, group=1, entry=1, agent="checker", result="Fine. **OK**."),
    ]
    assert decide(run(), LOOP, 1, steps).action == "next"


def test_a_loop_out_of_cycles_fails_its_checker_and_ends_the_run() -> None:
    checker = step(1, StepStatus.completed, group=1, entry=1, agent="checker", cycle=2, conclusion="Still no.")
    decision = decide(run(), LOOP, 1, [step(0, StepStatus.completed, cycle=2), checker])
    reason = "its reply did not end with OK after 3 cycle(s)"
    assert [(e.index, e.reason) for e in decision.exhausted] == [(1, reason)]
    assert (decision.action, decision.reason) == ("end", f"step 1 (checker) failed: {reason}")


# --------------------------------------------------------------------------- tidy


def test_tidy_applies_finished_rescues_and_ends_steps_nothing_works_on() -> None:
    steps = [
        step(0, StepStatus.failed, error="broke"),
        step(1, StepStatus.completed, agent="fixer", rescue_of=0, result="saved"),
        step(2, StepStatus.failed, error="lost"),
        step(3, StepStatus.failed, agent="fixer", rescue_of=2, error="no luck"),
        step(4, StepStatus.running),
        step(5, StepStatus.pending, agent="fixer", rescue_of=2),  # a rescue is not abandoned: it is resumed
    ]
    tidying = tidy(run(), steps)
    assert [(t.index, r.index) for t, r in tidying.rescued] == [(0, 1)]
    assert tidying.rescue_failed == ((steps[2], "lost; its rescue (step 3, fixer) failed too: no luck"),)
    assert tidying.abandoned == (4,)


def test_tidy_notes_a_failed_rescue_once() -> None:
    target = step(0, StepStatus.failed, error="lost; its rescue (step 1, fixer) failed too: no luck")
    assert tidy(run(), [target, step(1, StepStatus.failed, agent="fixer", rescue_of=0)]).rescue_failed == ()


def test_tidy_records_nothing_for_a_stopped_run() -> None:
    tidying = tidy(run(stop_requested=True), [step(0, StepStatus.running)])
    assert tidying.abandoned == () and tidying.rescued == ()
