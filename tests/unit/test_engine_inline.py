"""moto's states with no timeout run on their caller's thread (adapters/engine/moto_inline.py):
the patch is in place, keeps moto's own path for a state with a timeout, and changes nothing
a drive records."""

from __future__ import annotations

import inspect
from collections import Counter
from pathlib import Path
from typing import Any

from helpers import write_workspace

from laneflow.adapters.engine import local, moto_inline
from laneflow.adapters.store import open_store
from laneflow.domain.records import Run, RunStatus
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


def test_the_patched_method_is_moto_s_with_the_shape_it_was_written_for() -> None:
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.component.state.exec.execute_state import ExecutionState

    local.install_interpreter_hook()
    patched = ExecutionState._evaluate_with_timeout
    assert getattr(patched, moto_inline.PATCHED, False)
    source = inspect.getsource(patched.original)  # type: ignore[attr-defined]
    # moto's own: a thread per state to wait with its timeout, then the output's handling,
    # which the inline path repeats step for step
    for line in (
        "thread.start()",
        "terminated_event.wait(timeout_seconds)",
        "self.result_selector.eval(env=env)",
        "self.result_path.eval(env)",
        "env.states.set_result(execution_output)",
        "self.assign_decl.eval(env=env)",
    ):
        assert line in source, line
    assert TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS == 99999999
    moto_inline.install()  # idempotent
    assert ExecutionState._evaluate_with_timeout is patched


def _drive(tmp_path: Path, name: str) -> tuple[Run, Counter[Any]]:
    ws = write_workspace(
        tmp_path / name,
        {"worker": {"stub": "ttft_ms: 20\ndid {item}"}},
        {
            "fan": {
                "steps": [
                    {"agent": "worker", "each": [1, 2, 3, 4], "parallel": 2, "instruction": "Do {item}."},
                    {"agent": "worker", "instruction": "Sum up."},
                ]
            }
        },
    )
    svc = for_store(open_store(f"sqlite:///{tmp_path / name}.db"), Settings(capture_dir=str(tmp_path / f"{name}-captures")))
    engine = local_engine(svc)
    run = create_run(svc, ws, "fan", {}, options={"gate": True})
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    history = [e for arn in result.executions for e in engine.history(arn)]
    return result.run, Counter(getattr(e["type"], "value", e["type"]) for e in history)


def test_a_drive_records_the_same_with_and_without_it(tmp_path: Path) -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.execute_state import ExecutionState

    local.install_interpreter_hook()
    patched = ExecutionState._evaluate_with_timeout
    inline_run, inline_events = _drive(tmp_path, "inline")
    ExecutionState._evaluate_with_timeout = patched.original  # type: ignore[attr-defined, method-assign]
    try:
        threaded_run, threaded_events = _drive(tmp_path, "threaded")
    finally:
        ExecutionState._evaluate_with_timeout = patched  # type: ignore[method-assign]
    assert inline_run.status == threaded_run.status == RunStatus.completed
    assert [(s.status, s.result) for s in inline_run.steps] == [(s.status, s.result) for s in threaded_run.steps]
    assert inline_events == threaded_events  # the same events, as many of each
    assert inline_events["TaskTimedOut"] == 0 and inline_events["TaskSucceeded"] > 0
