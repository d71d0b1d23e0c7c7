"""The embedded engine running real flows through statemachines/flow.asl.json.

Each test drives a flow from tests/fixtures or examples/ end to end: the definition's Map
states, the handlers in functions/, the SQLite store, the stub executor."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import EXAMPLES, FIXTURES, FlowRunner, error_of, spans_of

from laneflow.domain.records import Run, RunStatus, StepStatus
from laneflow.ports import Services

SEM = FIXTURES / "ws_semantics"


@pytest.mark.slow
def test_the_example_newsroom_flow_completes_with_layers_spans_and_json_data(run_flow: FlowRunner) -> None:
    result = run_flow(EXAMPLES / "newsroom", "brief", {"topics": ["tides", "reefs", "vents", "kelp", "ice"]})
    run = result.run
    assert result.execution_status == "SUCCEEDED"
    assert run.status == RunStatus.completed and run.finished_at and run.driven_at and run.drives == 1
    assert [s.status for s in run.steps] == [StepStatus.completed] * 8
    assert [s.group for s in run.steps] == [0, 0, 0, 0, 0, 1, 2, 3]
    assert all(s.prompt_layers and s.calls for s in run.steps)
    researchers = run.steps[:5]
    assert [s.item for s in researchers] == ["tides", "reefs", "vents", "kelp", "ice"]
    assert all(len(s.calls) == 2 and s.calls[0].tools == 2 for s in researchers)
    assert run.steps[7].data["slug"] == "ocean-records"
    assert run.cost_usd == pytest.approx(5 * 0.004 + 0.012 + 0.006 + 0.003)
    assert run.revision is not None and run.revision.startswith("sha256:")


def test_groups_run_in_order_and_never_overlap(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "handoff", {"things": ["a", "b", "c"], "audience": "kids"}).run
    by_group: dict[int, list[Any]] = {}
    for s in run.steps:
        by_group.setdefault(s.group, []).append(s)
    for g in range(1, max(by_group) + 1):
        earlier_end = max(s.finished_at for s in by_group[g - 1])
        later_start = min(s.started_at for s in by_group[g])
        assert earlier_end <= later_start


def test_each_fills_item_and_input_into_instructions(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "handoff", {"things": ["tides", "reefs"], "audience": "kids"}).run
    assert [s.instruction for s in run.steps[:2]] == ["Scout tides for kids.", "Scout reefs for kids."]
    assert run.steps[0].result == "Found tides.\n\nConclusion about tides."
    assert run.steps[0].conclusion == "Conclusion about tides."


def _user_message_of(svc: Services, run: Run, index: int) -> str:
    """What the step was told, reconstructed by the same function the runner uses."""
    from laneflow.domain.flow import step_spec
    from laneflow.usecases.run_step.handoff import handoff_for

    step = run.step(index)
    return handoff_for(svc, run, step, step_spec(run, step).handoff, group=step.group, cycle=step.cycle)


def test_handoff_kinds_results_conclusions_and_none(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "handoff", {"things": ["tides", "reefs"]}).run
    results = _user_message_of(svc, run, 2)
    assert "Found tides." in results and "Conclusion about reefs." in results
    conclusions = _user_message_of(svc, run, 3)
    assert "Conclusion about tides." in conclusions and "Found tides." not in conclusions
    assert _user_message_of(svc, run, 4) == ""


def test_handoff_data_passes_parsed_json(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "data").run
    assert run.status == RunStatus.completed
    assert [s.data for s in run.steps[:2]] == [{"items": ["x"]}, {"items": ["y"]}]
    block = _user_message_of(svc, run, 2)
    assert '"items": [\n    "x"\n  ]' in block


def test_a_model_error_is_retried_and_an_invalid_output_retried_with_its_errors(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "retry").run
    assert run.status == RunStatus.completed
    flaky, post = run.steps
    assert flaky.attempts == 2 and flaky.conclusion == "Worked on the second attempt."
    assert post.attempts == 2 and post.data == {"title": "Tides", "words": 300}
    errors = [e.text for e in post.events if e.type == "error"]
    assert len(errors) == 1 and "does not match its schema" in errors[0] and "title" in errors[0]
    # spans are numbered across attempts, and carry the attempt when it is not the first
    assert [(c.n, c.attempt) for c in post.calls] == [(1, None), (2, 2)]


def test_retries_zero_means_a_single_attempt(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "noretry").run
    assert run.status == RunStatus.failed
    assert run.steps[0].attempts == 1 and run.steps[0].error == "the model was overloaded"
    assert "step 0 (flaky) failed: the model was overloaded" in error_of(run)


def test_a_required_failure_fails_the_run_and_later_groups_never_start(run_flow: FlowRunner) -> None:
    result = run_flow(SEM, "required_fails")
    run = result.run
    assert run.status == RunStatus.failed and run.finished_at
    assert run.steps[0].status == StepStatus.failed
    assert run.steps[1].status == StepStatus.skipped and run.steps[1].attempts == 0
    assert run.steps[1].skip_reason == "the run failed before this step"
    assert result.execution_status == "SUCCEEDED"  # the definition ended the run itself


def test_an_optional_failure_is_recorded_and_the_run_goes_on(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "optional_fails").run
    assert run.status == RunStatus.completed
    assert run.steps[0].status == StepStatus.failed and run.steps[0].error == "optional thing broke"
    assert run.steps[2].status == StepStatus.completed


def test_parallel_caps_how_many_steps_of_an_entry_run_at_once(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "parallel").run
    assert run.status == RunStatus.completed
    spans = spans_of(run.steps)
    peak = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert peak == 2


def test_a_group_entry_runs_several_agents_at_once(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "optional_fails").run
    first_group = [s for s in run.steps if s.group == 0]
    assert {s.agent for s in first_group} == {"optional_failer", "scout"}


def test_no_step_is_left_running_when_a_handler_crashes(
    svc: Services, run_flow: FlowRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the step handler (an unexpected exception escaping it) is caught by the
    definition's Catch: StepCrashed ends the attempt and the run fails with the reason."""
    import laneflow.usecases.run_step.runner as step_module

    def explode(self: Any) -> None:
        raise RuntimeError("boom in the executor glue")

    monkeypatch.setattr(step_module.StepRunner, "run_attempts", explode)
    run = run_flow(SEM, "noretry").run
    assert run.status == RunStatus.failed
    step = run.steps[0]
    assert step.status == StepStatus.failed and "RuntimeError" in error_of(step)
    attempts = svc.store.list_attempts(run.tenant, run.id)
    assert attempts and all(a.status != "running" for a in attempts)


def test_a_drive_that_fails_outside_any_step_closes_the_run_failed(
    svc: Services, run_flow: FlowRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler with no Catch (SettleGroup) failing makes the execution fail; the engine
    then closes the run with the reason instead of leaving it `running`."""
    import laneflow.usecases.settle_group as drive

    def broken(svc: Services, req: Any) -> None:
        raise RuntimeError("settle exploded")

    monkeypatch.setattr(drive, "settle_group", broken)
    result = run_flow(SEM, "noretry")
    assert result.execution_status == "FAILED"
    run = result.run
    assert run.status == RunStatus.failed and run.finished_at
    assert "the drive failed (RuntimeError)" in error_of(run) and "settle exploded" in error_of(run)
    assert all(s.status != StepStatus.running for s in run.steps)
