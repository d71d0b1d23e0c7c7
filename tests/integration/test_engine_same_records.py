"""The engine's faster deep copy for moto's interpreter changes nothing a run records: the
same flow driven with moto's own `copy.deepcopy` and with the engine's gives the same
history events (by type and details) and the same steps."""

from __future__ import annotations

import copy
import importlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import FlowRunner

from laneflow.adapters.engine import local, moto_fastcopy
from laneflow.ports import Services
from laneflow.usecases.start_run import create_run


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nShared.\n")
    (ws / "agents" / "worker" / "agent.md").write_text('---\nstub: "Done with {item}."\n---\nYou do one item.\n')
    (ws / "flows" / "fan.yaml").write_text(
        "description: two fan-outs\ninput:\n  type: object\n  properties:\n    items: {type: array}\nsteps:\n"
        '  - agent: worker\n    each: input.items\n    instruction: "First {item}."\n'
        '  - agent: worker\n    each: input.items\n    instruction: "Then {item}."\n'
    )
    return ws


_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)?")


def _events(engine: Any, arn: str, run_id: str) -> Counter[str]:
    """The execution's events, each as its type and details with the run's own names and
    the times taken out (the order of a Map's iterations is the threads')."""
    name = arn.rsplit(":", 1)[-1]
    seen: Counter[str] = Counter()
    for event in engine.history(arn):
        shown = {k: v for k, v in event.items() if k not in ("id", "previousEventId", "timestamp")}
        text = json.dumps(shown, sort_keys=True, default=str).replace(name, "EXECUTION").replace(run_id, "RUN")
        seen[_STAMP.sub("TIME", text)] += 1
    return seen


def _drive(svc: Any, run_flow: Any, ws: Path) -> tuple[Counter[str], list[tuple[Any, ...]]]:
    engine = run_flow.engine
    run = create_run(svc, ws, "fan", {"items": ["a", "b", "c", "d"]}, options={"gate": False})  # a gate's waits are timing
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    steps = [(s.index, s.group, s.item, s.status, s.result, s.message, s.attempts) for s in result.run.steps]
    return _events(engine, result.execution_arn, run.id), steps


def test_a_run_records_the_same_with_moto_s_deepcopy_and_with_the_engine_s(
    svc: Services, run_flow: FlowRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = _workspace(tmp_path)
    local.install_interpreter_hook()
    fast_events, fast_steps = _drive(svc, run_flow, ws)
    for name in moto_fastcopy.MODULES:
        monkeypatch.setattr(importlib.import_module(name), "copy", copy)
    plain_events, plain_steps = _drive(svc, run_flow, ws)
    assert sum(fast_events.values()) > 50
    assert fast_events == plain_events
    assert fast_steps == plain_steps
