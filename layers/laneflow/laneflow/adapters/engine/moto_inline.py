"""One change to moto's interpreter: a state with no timeout runs on its caller's thread.

moto evaluates every Task, Map and Parallel state (`ExecutionState._evaluate_with_timeout`)
on a thread of its own, started for the one purpose of waiting for it with the state's
`TimeoutSeconds`, and keeps each such thread in a module list. A state with no
`TimeoutSeconds` waits with moto's default (99,999,999 s, three years): the thread buys
nothing, and a step paid two or three thread starts for it (a fifth of the engine's CPU in a
profile of 1,000 gated steps, with their Events and locks). Such a state is now evaluated on
the thread that reached it, in the same frame, with the same outputs and errors; a state
with a timeout (WaitForLead's 960 s, the sandbox's 86,400 s) keeps moto's own path. It is a
moto internal, so moto is pinned exactly and tests/unit/test_engine_inline.py fails if it
moves.
"""

from __future__ import annotations

import sys
from typing import Any

PATCHED = "_laneflow_inline"


def install() -> None:
    """Replace `ExecutionState._evaluate_with_timeout` (idempotent)."""
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.component.state.exec.execute_state import ExecutionState

    original = ExecutionState._evaluate_with_timeout
    if getattr(original, PATCHED, False):
        return
    untimed = TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS
    moto_module = sys.modules[ExecutionState.__module__]  # its `copy`, which moto_fastcopy may replace

    def _evaluate_with_timeout(self: Any, env: Any) -> None:
        self.timeout.eval(env=env)
        seconds = env.stack.pop()
        if seconds != untimed:
            original(self, env)  # evaluates its timeout again: a value, or a path of the input
            return
        frame = env.open_frame()
        frame.states.reset(input_value=env.states.get_input())
        frame.stack = moto_module.copy.deepcopy(env.stack)
        try:
            self._eval_execution(frame)
            output = frame.stack[-1]
        finally:
            frame.set_ended()
            env.close_frame(frame)
        # What moto's own does with the output, unchanged:
        env.stack.append(output)
        if not self._is_language_query_jsonpath():
            env.states.set_result(output)
        if self.assign_decl:
            self.assign_decl.eval(env=env)
        if self.result_selector:
            self.result_selector.eval(env=env)
        if self.result_path:
            self.result_path.eval(env)
        else:
            env.states.reset(input_value=env.stack.pop())

    setattr(_evaluate_with_timeout, PATCHED, True)
    _evaluate_with_timeout.original = original  # type: ignore[attr-defined]
    ExecutionState._evaluate_with_timeout = _evaluate_with_timeout  # type: ignore[method-assign]
