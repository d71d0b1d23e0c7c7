"""agent.md settings of the colleague tools, as `laneflow check` and loading an agent read
them: `tools: [peers, ask]` are known tools, `ask_timeout` keeps its bounds (naming the file
and the field), and an `ask_timeout` without the ask tool would be ignored, so it is refused.
And the prompt layers they add: `peers` (dynamic) names who runs beside the step, `ask`
(stable) says when to ask."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from helpers import write_workspace

from laneflow.domain.flow import check_workspace
from laneflow.domain.inbox import ASK_TIMEOUT_BOUNDS, DEFAULT_ASK_TIMEOUT_S, Peer, ask_wait
from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.ports import Services

FLOW = {"one": {"description": "d", "steps": [{"agent": "a"}]}}


def problems_of(tmp_path: Path, settings: dict[str, Any]) -> list[Any]:
    ws = write_workspace(tmp_path / "ws", {"a": settings}, FLOW)
    return [p for p in check_workspace(ws) if p.severity == "error"]


@pytest.mark.parametrize("value", [0, 0.5, -3, 86_401, 10**9, "600", True])
def test_an_ask_timeout_out_of_bounds_or_not_a_number_is_refused_naming_file_and_field(tmp_path: Path, value: Any) -> None:
    [problem] = problems_of(tmp_path, {"tools": ["ask"], "ask_timeout": value})
    assert problem.file == "agents/a/agent.md" and problem.field == "ask_timeout" and problem.line


@pytest.mark.parametrize("value", [1, 30, 600.5, 86_400])
def test_an_ask_timeout_within_bounds_is_taken(tmp_path: Path, value: float) -> None:
    assert problems_of(tmp_path, {"tools": ["ask"], "ask_timeout": value}) == []
    ws = load_workspace(tmp_path / "ws")
    assert load_agent(ws, "a").settings.ask_timeout == value


def test_an_ask_timeout_without_the_ask_tool_would_be_ignored_so_it_is_refused(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, {"tools": ["peers"], "ask_timeout": 30})
    assert problem.field == "ask_timeout" and "no ask tool" in problem.message


def test_peers_and_ask_are_known_tools_and_a_near_miss_is_named(tmp_path: Path) -> None:
    assert problems_of(tmp_path, {"tools": ["peers", "ask", "read_file"]}) == []
    [problem] = problems_of(tmp_path / "b", {"tools": ["peer"]})
    assert problem.field == "tools[0]" and "'peers'" in problem.message


def test_the_default_wait_and_its_bounds() -> None:
    assert DEFAULT_ASK_TIMEOUT_S == 600 and ASK_TIMEOUT_BOUNDS == (1.0, 86_400.0)
    assert ask_wait(600, step_left=None, lambda_left=None) == 600
    assert ask_wait(600, step_left=42.0, lambda_left=None) == 42.0
    assert ask_wait(600, step_left=None, lambda_left=100.0) == 70.0  # Lambda: its remaining time minus the margin
    assert ask_wait(600, step_left=None, lambda_left=10.0) == 0.0


def test_the_peers_layer_is_dynamic_and_names_who_runs_beside_the_step(tmp_path: Path) -> None:
    ws_root = write_workspace(tmp_path / "ws", {"a": {"tools": ["peers", "ask"], "ask_timeout": 90}}, FLOW)
    ws = load_workspace(ws_root)
    agent = load_agent(ws, "a")
    peers = [
        Peer(agent="scout", index=1, item="north", status="running"),
        Peer(agent="scout", index=2, item="south", status="pending"),
    ]
    prompt = build_system_prompt(ws, agent, peers=peers)
    layers = {layer.name: layer for layer in prompt.layers}
    assert layers["peers"].dynamic and not layers["ask"].dynamic
    assert "scout (step 1, item 'north')" in layers["peers"].text and "never a hand-over" in layers["peers"].text
    assert "peers" not in prompt.stable and "scout (step 2" in prompt.dynamic
    assert "at most 90 s" in layers["ask"].text and layers["ask"].text in prompt.stable
    alone = {layer.name: layer for layer in build_system_prompt(ws, agent, peers=[]).layers}
    assert "alone" in alone["peers"].text
    # The stable half (what the cache keeps) is the same whoever runs beside it.
    assert build_system_prompt(ws, agent, peers=peers).stable == build_system_prompt(ws, agent, peers=[]).stable


def test_in_lambda_an_ask_stops_waiting_a_margin_before_the_invocations_deadline() -> None:
    import time

    from laneflow.domain.inbox import LAMBDA_MARGIN_S
    from laneflow.domain.records import AttemptRef, Run, Step
    from laneflow.domain.workers import LambdaRequest, LocalProcess
    from laneflow.usecases.run_step.inbox import AttemptInbox

    run = Run(id="run-1", tenant="local", workspace="w", flow="f", steps=[Step(index=0, group=0, agent="a", item=None)])
    ref = AttemptRef(tenant="local", run_id="run-1", index=0, n=1, token="t", started_at="now")

    def inbox(**kwargs: Any) -> AttemptInbox:
        return AttemptInbox(
            svc=cast(Services, None),  # none: the test reads the inbox's settings only
            run=run,
            step=run.steps[0],
            ref=ref,
            agent="a",
            stopped=lambda: False,
            ask_timeout=600,
            **kwargs,
        )

    lambda_wait = inbox(worker=LambdaRequest(request_id="r", deadline=time.time() + 300)).wait_s()
    assert 300 - LAMBDA_MARGIN_S - 2 < lambda_wait <= 300 - LAMBDA_MARGIN_S
    assert inbox(worker=LocalProcess(host="h", pid=1)).wait_s() == 600
    step_wait = inbox(worker=LocalProcess(host="h", pid=1), step_deadline=time.monotonic() + 20).wait_s()
    assert 18 < step_wait <= 20
