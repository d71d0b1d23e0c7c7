"""Benchmark: runs of any size against Step Functions' limits, on the embedded engine.

Each scenario runs the deployed definition (statemachines/flow.asl.json) on the embedded
engine and the SQLite store, in a child process of its own (so its peak RSS is its own), and
reports, from `get_execution_history` of every execution the run used:

- executions per run (a drive continues as a new execution before its history gets long);
- max_history_events: the most history events of any one execution (goal <= 20,000);
- max_state_bytes: the largest input or output of any state of any execution (goal <= 200,000);
- wall seconds; CPU a step (the engine's process and its step workers); the drive's peak RSS
  (each process's VmHWM, started again as the drive starts: the run's creation is not counted);
- between scenarios: CPU a step at 10,000 against 1,000 (goal <= 1.3x), the 100,000-step
  drive's peak (goal < 1 GB) and against the 10,000-step one's (goal <= 1.5x);
- for the gated lane, its makespan (first step start to last step end, from the records) beside
  the ideal for its cap: ceil(steps / parallel) x one step's duration (goal: within 10 %).

    python bench/scale.py [--json] [--write] [--only NAME ...]

Scenarios: fanout-1000, fanout-10000, fanout-100000, groups-200x10, gated-12-at-3.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import Goal, exit_code, goal_table, load_note, machine, write_section  # noqa: E402

MAX_HISTORY_EVENTS = 20_000
MAX_STATE_BYTES = 200_000
MAKESPAN_SLACK = 0.10
COST_RATIO = 1.3  # a step of a 10,000-step fan-out costs at most 1.3x one of a 1,000-step fan-out
MEMORY_MIB = 1024  # a 100,000-step fan-out's peak memory, engine and step workers
MEMORY_RATIO = 1.5  # ... and at most 1.5x the 10,000-step one's: bounded by the window
# The gated lane's steps: 400 ms to the first token, 2 s in all.
GATED_TTFT_MS, GATED_STEP_MS, GATED_STEPS, GATED_PARALLEL = 400, 2000, 12, 3


SCENARIOS: dict[str, dict[str, Any]] = {
    "fanout-1000": {"kind": "fanout", "steps": 1000},
    "fanout-10000": {"kind": "fanout", "steps": 10_000},
    "fanout-100000": {"kind": "fanout", "steps": 100_000},
    "groups-200x10": {"kind": "groups", "groups": 200, "fanout": 10},
    "gated-12-at-3": {"kind": "gated", "steps": GATED_STEPS, "parallel": GATED_PARALLEL},
}


def make_workspace(root: Path, spec: dict[str, Any]) -> Path:
    ws = root / "scale-ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "agents" / "pacer").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nBenchmark workspace.\n")
    (ws / "agents" / "worker" / "agent.md").write_text(
        '---\ndescription: does one item\nstub: "Done with {item}."\n---\nYou do one item of work.\n'
    )
    (ws / "agents" / "pacer" / "agent.md").write_text(
        "---\ndescription: one paced item\nstub: |\n"
        f"  ttft_ms: {GATED_TTFT_MS}\n  delay_ms: {GATED_STEP_MS}\n  Paced {{item}}.\n"
        "---\nYou do one item of work, slowly.\n"
    )
    items = "input:\n  type: object\n  properties:\n    items: {type: array}\n"
    if spec["kind"] == "groups":
        entries = "".join(
            f'  - agent: worker\n    each: input.items\n    instruction: "Group {g}: handle {{item}}."\n'
            for g in range(spec["groups"])
        )
    elif spec["kind"] == "gated":
        entries = f"  - agent: pacer\n    each: input.items\n    parallel: {spec['parallel']}\n"
    else:
        entries = '  - agent: worker\n    each: input.items\n    instruction: "Handle {item}."\n'
    (ws / "flows" / "scale.yaml").write_text("description: scale benchmark\n" + items + "steps:\n" + entries)
    return ws


def items_of(spec: dict[str, Any]) -> list[int]:
    count = spec["fanout"] if spec["kind"] == "groups" else spec["steps"]
    # Plain numbers: a run's input is at most 1 MiB of JSON, and 100,000 "item-N" strings pass it.
    return list(range(count))


def executions_of(backend: Any, machine_arn: str, run_id: str) -> list[str]:
    """Every execution of the state machine that drove this run (named after the run)."""
    arns = []
    for execution in backend.describe_state_machine(machine_arn).executions:
        if run_id in execution.execution_arn.rsplit(":", 1)[-1]:
            arns.append(execution.execution_arn)
    return arns


def state_bytes(event: dict[str, Any]) -> int:
    """The largest input or output an event carries (a state's, a task's, a map iteration's)."""
    largest = 0
    for key, details in event.items():
        if not key.endswith("EventDetails") or not isinstance(details, dict):
            continue
        for field in ("input", "output", "parameters"):
            value = details.get(field)
            if isinstance(value, str):
                largest = max(largest, len(value.encode()))
    return largest


def history_figures(history: list[dict[str, Any]]) -> dict[str, int]:
    """What the benchmark keeps of one execution's history: its events, its largest state
    input or output, and its states entered."""
    return {
        "events": len(history),
        "state_bytes": max((state_bytes(e) for e in history), default=0),
        "entered": sum(1 for e in history if e["type"].endswith("StateEntered")),
    }


def run_one(name: str) -> dict[str, Any]:
    """One scenario, in this process: the figures as a dict."""
    from benchlib import cpu_s, load, peak_rss_mib, reset_peak

    from laneflow.adapters.engine.local import _backend
    from laneflow.adapters.store import open_store
    from laneflow.usecases.start_run import create_run
    from laneflow.wiring import for_store, local_engine

    spec = SCENARIOS[name]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, spec)
        svc = for_store(open_store(f"sqlite:///{root / 'scale.db'}"))
        engine = local_engine(svc)
        warm = create_run(svc, ws, "scale", {"items": ["a", "b"]})  # the interpreter's imports
        engine.drive(warm.tenant, warm.id)

        # Each execution the drive continued from is dropped once the next runs (the drive holds
        # one execution's state): its figures are taken as it is retired.
        seen: dict[str, dict[str, int]] = {}
        engine.on_retire = lambda arn, history: seen.__setitem__(arn, history_figures(history))
        pool = engine.registry.step_workers
        workers = [w.process.pid for w in pool.workers] if pool else []
        cpu_before = sum(cpu_s(pid) for pid in [os.getpid(), *workers])
        load_before = load()

        created = time.perf_counter()
        run = create_run(svc, ws, "scale", {"items": items_of(spec)})
        # The drive's own peak: the run's creation (its input and its steps, made at once) and
        # the warm-up are not counted, nor is this benchmark's reading of the run after it.
        from_drive = all([reset_peak(pid) for pid in [os.getpid(), *workers]])
        started = time.perf_counter()
        result = engine.drive(run.tenant, run.id)
        wall = time.perf_counter() - started
        cpu = sum(cpu_s(pid) for pid in [os.getpid(), *workers]) - cpu_before
        workers_rss = sum(peak_rss_mib(pid) for pid in workers)
        drive_rss = peak_rss_mib(os.getpid()) if from_drive else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        load_after = load()
        final = svc.store.get_run(run.tenant, run.id)
        arns = list(getattr(result, "executions", None) or executions_of(_backend(), engine.state_machine_arn, run.id))
        per_execution = [seen.get(arn) or history_figures(engine.history(arn)) for arn in arns]
        steps = [s for s in final.steps if s.rescue_of is None]
        figures: dict[str, Any] = {
            "scenario": name,
            "what_ran": f"{len(steps)} stub steps through the deployed definition on the embedded engine",
            "steps": len(steps),
            "run_status": str(final.status),
            "steps_completed": sum(1 for s in steps if str(s.status) == "completed"),
            "executions": len(arns),
            "max_history_events": max(f["events"] for f in per_execution),
            "history_events": sum(f["events"] for f in per_execution),
            "max_state_bytes": max(f["state_bytes"] for f in per_execution),
            "state_transitions_per_step": round(sum(f["entered"] for f in per_execution) / max(1, len(steps)), 2),
            "step_workers": svc.settings.step_workers,
            "create_s": round(started - created, 3),
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 2),
            "cpu_ms_per_step": round(cpu * 1000 / max(1, len(steps)), 2),
            "peak_rss_mib": round(drive_rss, 1),
            "peak_of": "the drive" if from_drive else "the process",
            "workers_peak_rss_mib": round(workers_rss, 1),
            "loads": [load_before, load_after],
        }
        figures["peak_rss_with_workers_mib"] = round(figures["peak_rss_mib"] + workers_rss, 1)
        if spec["kind"] == "gated":
            from gated_lane import lane_figures

            lane = lane_figures(steps, spec["parallel"], GATED_STEP_MS)
            figures["parallel"] = spec["parallel"]
            figures["makespan_s"], figures["ideal_makespan_s"] = lane["makespan_s"], lane["ideal_s"]
            figures["makespan_over_ideal"] = round(lane["over_ideal_pct"] / 100, 3)
            figures["most_running"] = lane["most_running"]
    figures["goals"] = goals(figures)
    return figures


def goals(f: dict[str, Any]) -> dict[str, bool]:
    met = {
        "completed": f["run_status"] == "completed" and f["steps_completed"] == f["steps"],
        "max_history_events <= 20000": f["max_history_events"] <= MAX_HISTORY_EVENTS,
        "max_state_bytes <= 200000": f["max_state_bytes"] <= MAX_STATE_BYTES,
    }
    if "makespan_s" in f:
        met["makespan within 10% of ideal"] = f["makespan_over_ideal"] <= MAKESPAN_SLACK
        met["never more than parallel running"] = f["most_running"] <= f["parallel"]
    return met


def in_child(name: str, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--one", name],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"scenario": name, "error": f"did not finish within {timeout_s:.0f} s", "goals": {"finished": False}}
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-5:]
        return {"scenario": name, "error": " | ".join(tail) or f"exit {done.returncode}", "goals": {"finished": False}}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def markdown(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        "## scale — runs of any size inside Step Functions' limits (embedded engine, stub model)",
        "",
        f"Machine: {machine}. Command: `python bench/scale.py --write`; each scenario in a child process of its own, with "
        f"{rows[0].get('step_workers', 0) if rows else 0} step worker(s) beside it (`--step-workers`).",
        "",
        "| scenario | steps | run | executions | max history events | max state bytes | transitions per step | wall s | CPU ms a step (engine and workers) | the drive's peak RSS MiB (engine + workers) | makespan / ideal s | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['scenario']} | — | {r['error']} | | | | | | | | | NOT met |")
            continue
        span = f"{r['makespan_s']} / {r['ideal_makespan_s']}" if "makespan_s" in r else "—"
        missed = [g for g, ok in r["goals"].items() if not ok]
        verdict = "met" if not missed else "NOT met: " + ", ".join(missed)
        lines.append(
            f"| {r['scenario']} | {r['steps']} | {r['run_status']} | {r['executions']} | {r['max_history_events']} | "
            f"{r['max_state_bytes']} | {r['state_transitions_per_step']} | {r['wall_s']} | {r['cpu_ms_per_step']} | "
            f"{r['peak_rss_with_workers_mib']} ({r['peak_rss_mib']} + {r['workers_peak_rss_mib']}) | {span} | {verdict} |"
        )
    between = across(rows)
    if between:
        loads = [x for r in rows if "loads" in r for x in r["loads"]]
        lines += ["", f"Between scenarios ({load_note(loads[0], max(loads), loads[-1])}):", "", goal_table(between)]
    return "\n".join(lines) + "\n"


def across(rows: list[dict[str, Any]]) -> list[Goal]:
    """The goals that compare one scenario's measured figure with another's: the cost of a
    step as a run grows, and a drive's memory bounded by its window, not by its run."""
    by = {r["scenario"]: r for r in rows if "error" not in r}
    small, large, huge = by.get("fanout-1000"), by.get("fanout-10000"), by.get("fanout-100000")
    memory = "peak_rss_with_workers_mib"
    goals: list[Goal] = []
    if small and large:
        # The loads before each scenario: a 10,000-step scenario's own two processes lift the
        # 1-minute load to about the cores by its end, which says nothing of the machine.
        loads = (small["loads"][0], large["loads"][0])
        goals.append(_ratio("CPU a step, 10,000-step fan-out : 1,000-step", large, small, "cpu_ms_per_step", COST_RATIO, loads))
    if huge:
        goals.append(
            Goal("peak memory, 100,000-step fan-out (engine + workers)", huge[memory], MEMORY_MIB, timed=False, unit=" MiB")
        )
    if huge and large:
        goals.append(_ratio("peak memory, 100,000-step fan-out : 10,000-step", huge, large, memory, MEMORY_RATIO, None))
    return goals


def _ratio(
    name: str, over: dict[str, Any], under: dict[str, Any], key: str, limit: float, loads: tuple[float, ...] | None
) -> Goal:
    """One scenario's measured figure over another's (timed when `loads` are given)."""
    return Goal(name, round(over[key] / under[key], 3), limit, timed=loads is not None, loads=loads or (), unit="x")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object, nothing else")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md's scale section")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one scenario may take (default 3600)")
    parser.add_argument("--one", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--step-workers",
        type=int,
        default=1,
        help="step worker processes (LANEFLOW_STEP_WORKERS; a stub run's steps all go to one of them, 0 runs every step in the engine's process)",
    )
    args = parser.parse_args()
    if args.one:  # a scenario's child: its step workers are the parent's LANEFLOW_STEP_WORKERS
        print(json.dumps(run_one(args.one)))
        return 0
    os.environ["LANEFLOW_STEP_WORKERS"] = str(args.step_workers)  # the scenarios' children read it

    rows = []
    for name in args.only or list(SCENARIOS):
        if not args.json:
            print(f"scale: {name} ...", file=sys.stderr, flush=True)
        rows.append(in_child(name, args.timeout))
    if args.write:
        write_section(HERE / "RESULTS.md", "scale", markdown(rows, machine()))
    if args.json:
        print(json.dumps({"benchmark": "scale", "scenarios": rows}))
    else:
        print(markdown(rows, machine()))
    met = all(all(r["goals"].values()) for r in rows)
    return 0 if met and exit_code(across(rows)) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
