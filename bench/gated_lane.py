"""Benchmark: the makespan of one gated lane against the ideal for its cap, and against the
same lane without the gate.

A lane of 12 stub steps of one agent at `parallel: 3`, each 2 s long with its reply
beginning 400 ms in (stub `delay_ms`, `ttft_ms`), through the real definition on the
embedded engine, with the warm gate on and off, alternating (on/off, off/on, ...) for
`--repeat` pairs in this one process. Times come from the records (first step's start to
last step's end), not the wall clock; the ideal is ceil(steps / parallel) x step length.
Also: the most steps running at any instant (from the steps' start and end times) and the
state transitions per step (StateEntered events in the execution's history).

Goals: the median gated makespan over the median ungated one at most 1.05 (the gate costs no
wall time at a `parallel:` cap), and within 10 % of the ideal (both timed: unmeasured when the
machine was busy, its 1-minute load above its cores before or after); never more than
`parallel` running at once in any run (a count). Exit 1 when a measured goal is missed.

    python bench/gated_lane.py [--steps 12] [--parallel 3] [--delay-ms 2000] [--ttft-ms 400] [--repeat 3] [--json] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, span, write_section

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


def one_run(steps: int, parallel: int, delay_ms: int, ttft_ms: int, gate: bool, warm_up: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, parallel, delay_ms, ttft_ms)
        svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"))
        engine = local_engine(svc)
        if warm_up:  # the interpreter's first-run imports, once a process
            warm = create_run(svc, ws, "lane", {"items": ["a"]})
            engine.drive(warm.tenant, warm.id, tick_s=0.02)
        run = create_run(svc, ws, "lane", {"items": [f"item-{i}" for i in range(steps)]}, options={"gate": gate})
        before = load()
        result = engine.drive(run.tenant, run.id, tick_s=0.02)
        loads = (before, load())
        history = engine.history(result.execution_arn)
    entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
    return {
        "gate": gate,
        "status": str(result.run.status),
        **lane_figures(result.run.steps, parallel, delay_ms),
        "state_transitions_per_step": round(entered / steps, 2),
        "loads": [round(x, 2) for x in loads],
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


ON_OFF_LIMIT = 1.05  # the gated makespan over the ungated one
IDEAL_LIMIT_PCT = 10.0  # the gated makespan over the ideal for the cap


def run_bench(steps: int, parallel: int, delay_ms: int, ttft_ms: int, repeat: int = 3) -> dict[str, Any]:
    """`repeat` pairs of runs, gate on and off, alternating which goes first, so a drift of the
    machine over the bench falls on both alike."""
    runs: list[dict[str, Any]] = []
    for pair in range(repeat):
        for gate in (True, False) if pair % 2 == 0 else (False, True):
            runs.append(one_run(steps, parallel, delay_ms, ttft_ms, gate, warm_up=not runs))
    on = [r["makespan_s"] for r in runs if r["gate"]]
    off = [r["makespan_s"] for r in runs if not r["gate"]]
    return {
        "benchmark": "gated_lane",
        "steps": steps,
        "parallel": parallel,
        "delay_ms": delay_ms,
        "ttft_ms": ttft_ms,
        "repeat": repeat,
        "runs": runs,
        "median_on_s": statistics.median(on),
        "median_off_s": statistics.median(off),
        "on_off_ratio": round(statistics.median(on) / statistics.median(off), 4),
        "ideal_s": runs[0]["ideal_s"],
        "machine": machine(),
    }


def goals(r: dict[str, Any]) -> list[Goal]:
    loads = span([x for run in r["runs"] for x in run["loads"]])
    gated = [run for run in r["runs"] if run["gate"]]
    over_ideal = 100 * (r["median_on_s"] - r["ideal_s"]) / r["ideal_s"]
    return [
        Goal("median makespan, gate on / gate off", r["on_off_ratio"], ON_OFF_LIMIT, loads=loads, unit="x"),
        Goal("median gated makespan over the ideal", round(over_ideal, 1), IDEAL_LIMIT_PCT, loads=loads, unit=" %"),
        Goal(
            "most steps running at once, any run",
            max(run["most_running"] for run in r["runs"]),
            r["parallel"],
            timed=False,
            loads=loads,
        ),
        Goal(
            "gated runs completed",
            sum(run["status"] == "completed" for run in gated),
            len(gated),
            timed=False,
            floor=True,
            loads=loads,
        ),
    ]


def markdown(r: dict[str, Any], judged: list[Goal]) -> str:
    lines = [
        f"## gated_lane — one lane of {r['steps']} stub steps at `parallel: {r['parallel']}`"
        f" ({r['delay_ms']} ms each, reply after {r['ttft_ms']} ms), gate on and off alternating, {r['repeat']} pairs",
        "",
        f"Machine: {r['machine']}. Command: `python bench/gated_lane.py --write`. Times from the records.",
        "",
        "| run | gate | status | makespan s | ideal s | over ideal | most running at once | state transitions per step | load before / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, run in enumerate(r["runs"], 1):
        lines.append(
            f"| {n} | {'on' if run['gate'] else 'off'} | {run['status']} | {run['makespan_s']} | {run['ideal_s']} |"
            f" {run['over_ideal_pct']} % | {run['most_running']} | {run['state_transitions_per_step']} |"
            f" {run['loads'][0]:.2f} / {run['loads'][1]:.2f} |"
        )
    loads = judged[0].loads
    lines += [
        "",
        f"Median makespan: {r['median_on_s']} s gated, {r['median_off_s']} s ungated (ratio {r['on_off_ratio']}x); "
        f"over the {len(r['runs'])} runs, {load_note(*loads)}.",
        "",
        goal_table(judged),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--delay-ms", type=int, default=2000)
    parser.add_argument("--ttft-ms", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs, gate on and off")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    result = run_bench(args.steps, args.parallel, args.delay_ms, args.ttft_ms, args.repeat)
    judged = goals(result)
    result["goals"] = [g.__dict__ | {"verdict": g.verdict} for g in judged]
    print(json.dumps(result, indent=2) if args.json else markdown(result, judged))
    if args.write:
        write_section(HERE / "RESULTS.md", "gated_lane", markdown(result, judged))
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
