"""Benchmark: the makespan of one gated lane against the ideal for its cap.

A lane of 12 stub steps of one agent at `parallel: 3`, each 2 s long with its reply
beginning 400 ms in (stub `delay_ms`, `ttft_ms`), through the real definition on the
embedded engine, once with the warm gate on and once off. Times come from the records
(first step's start to last step's end), not the wall clock; the ideal is
ceil(steps / parallel) x step length. Also: the most steps running at any instant (from
the steps' start and end times) and the state transitions per step (StateEntered events
in the execution's history).

    python bench/gated_lane.py [--steps 12] [--parallel 3] [--delay-ms 2000] [--ttft-ms 400] [--json] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import machine, write_section

from laneflow.adapters.store import open_store
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent


def make_workspace(root: Path, parallel: int, delay_ms: int, ttft_ms: int) -> Path:
    ws = root / "lane-ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("Benchmark workspace for a gated lane.\n")
    (ws / "agents" / "worker" / "agent.md").write_text(
        f"---\nstub: |\n  ttft_ms: {ttft_ms}\n  delay_ms: {delay_ms}\n  Done {{item}}.\n---\nYou work.\n"
    )
    (ws / "flows" / "lane.yaml").write_text(
        "description: one gated lane\ninput:\n  type: object\n  properties:\n    items: {type: array}\n"
        f"steps:\n  - agent: worker\n    each: input.items\n    parallel: {parallel}\n"
    )
    return ws


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def one_run(steps: int, parallel: int, delay_ms: int, ttft_ms: int, gate: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, parallel, delay_ms, ttft_ms)
        svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"))
        engine = local_engine(svc)
        warm = create_run(svc, ws, "lane", {"items": ["a"]})  # the interpreter's first-run imports
        engine.drive(warm.tenant, warm.id, tick_s=0.02)
        run = create_run(svc, ws, "lane", {"items": [f"item-{i}" for i in range(steps)]}, options={"gate": gate})
        result = engine.drive(run.tenant, run.id, tick_s=0.02)
        history = engine.history(result.execution_arn)
    entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
    return {
        "gate": gate,
        "status": str(result.run.status),
        **lane_figures(result.run.steps, parallel, delay_ms),
        "state_transitions_per_step": round(entered / steps, 2),
    }


def lane_figures(steps: list[Any], parallel: int, delay_ms: int) -> dict[str, Any]:
    """A lane's makespan (its first step's start to its last step's end, from the records),
    the ideal for its cap (ceil(steps / parallel) x one step's duration), and the most steps
    that ran at once."""
    spans = [(ts(s.started_at), ts(s.finished_at)) for s in steps if s.started_at and s.finished_at]
    makespan = (max(b for _, b in spans) - min(a for a, _ in spans)).total_seconds()
    ideal = math.ceil(len(steps) / parallel) * delay_ms / 1000
    return {
        "makespan_s": round(makespan, 3),
        "ideal_s": ideal,
        "over_ideal_pct": round(100 * (makespan - ideal) / ideal, 1),
        "most_running": max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans),
    }


def run_bench(steps: int, parallel: int, delay_ms: int, ttft_ms: int) -> dict[str, Any]:
    runs = [one_run(steps, parallel, delay_ms, ttft_ms, gate) for gate in (True, False)]
    return {
        "benchmark": "gated_lane",
        "steps": steps,
        "parallel": parallel,
        "delay_ms": delay_ms,
        "ttft_ms": ttft_ms,
        "runs": runs,
        "goal": "gated makespan within 10 % of the ideal, never more than `parallel` running (the run without the gate is for comparison)",
        "goal_met": all(r["over_ideal_pct"] <= 10 and r["most_running"] <= parallel for r in runs if r["gate"]),
        "machine": machine(),
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"## gated_lane — one lane of {r['steps']} stub steps at `parallel: {r['parallel']}`"
        f" ({r['delay_ms']} ms each, reply after {r['ttft_ms']} ms)",
        "",
        f"Machine: {r['machine']}. Command: `python bench/gated_lane.py --write`. Times from the records.",
        "",
        "| gate | status | makespan s | ideal s | over ideal | most running at once | state transitions per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        lines.append(
            f"| {'on' if run['gate'] else 'off'} | {run['status']} | {run['makespan_s']} | {run['ideal_s']} | {run['over_ideal_pct']} % |"
            f" {run['most_running']} | {run['state_transitions_per_step']} |"
        )
    lines += ["", f"Goal ({r['goal']}): {'met' if r['goal_met'] else 'NOT met'}.", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--delay-ms", type=int, default=2000)
    parser.add_argument("--ttft-ms", type=int, default=400)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    result = run_bench(args.steps, args.parallel, args.delay_ms, args.ttft_ms)
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    if args.write:
        write_section(HERE / "RESULTS.md", "gated_lane", markdown(result))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
