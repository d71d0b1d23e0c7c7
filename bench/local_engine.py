"""Benchmark: the embedded engine driving 10 groups x a fan-out of 100 stub steps (no delay).

Every step goes through the real definition (Map states, Lambda Task states answered by the
handlers in-process, or RunStep's by step worker processes) and the real SQLite store, so
the figure is laneflow's orchestration overhead per step. Each gate setting is measured in
the engine's process and with one step worker (`--step-workers 0 1`, the default), with the
CPU each process used. Writes bench/RESULTS.md's section (with --write) and prints a table,
or one JSON object with --json.

    python bench/local_engine.py [--groups 10] [--fanout 100] [--step-workers 0 1] [--json] [--write] [--copies]

`--copies` also times every deep copy moto's interpreter makes (it copies a state's input
for each Map iteration, Parallel branch and Task frame), summed over its threads, and prints
that per step: how much of a step's cost is copying what the definition carries.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, peak_rss_mib, write_section
from benchlib import cpu_s as _cpu_s

from laneflow.adapters.engine import moto_fastcopy
from laneflow.adapters.engine import step_workers as step_workers_module
from laneflow.adapters.store import open_store
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent
CPU_MS_PER_STEP = 3.5  # engine and step workers together, a 1,000-step stub fan-out
GATED_WALL_S = 5.0  # 1,000 gated stub steps


class CopyClock:
    """Times the outermost `copy.deepcopy` calls of every thread (moto calls it through the
    module, so replacing the module's function sees them all; the modules the engine gives
    its faster copy, `moto_fastcopy`, call that stand-in's, timed too)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        self._lock, self._depth = threading.Lock(), threading.local()
        self._original = copy.deepcopy

    def __enter__(self) -> CopyClock:
        original = self._original
        # setattr: mypy holds a module's function to its own signature
        setattr(copy, "deepcopy", lambda value, memo=None, _nil=[]: self._timed(original, value, memo))  # noqa: B010
        # The modules the engine gives its faster copy (moto_fastcopy) call the stand-in's.
        fast = self._fast = getattr(moto_fastcopy._COPY, "deepcopy")  # noqa: B009
        setattr(moto_fastcopy._COPY, "deepcopy", lambda value, memo=None, _nil=None: self._timed(fast, value, memo))  # noqa: B010
        return self

    def _timed(self, fn: Callable[[Any, Any], Any], value: Any, memo: Any) -> Any:
        if getattr(self._depth, "n", 0):  # a copy inside a copy: counted in the outer one
            return fn(value, memo)
        self._depth.n = 1
        started = time.perf_counter()
        try:
            return fn(value, memo)
        finally:
            self._depth.n = 0
            with self._lock:
                self.seconds += time.perf_counter() - started
                self.calls += 1

    def __exit__(self, *exc: object) -> None:
        setattr(copy, "deepcopy", self._original)  # noqa: B010
        setattr(moto_fastcopy._COPY, "deepcopy", self._fast)  # noqa: B010


class _Identity:
    """A handler registry whose one function answers each call with its payload."""

    def invoke(self, function_name: str, payload: Any) -> dict[str, Any]:
        return {"StatusCode": 200, "Payload": payload}


def interpreter_floor(steps: int) -> float:
    """CPU ms a step of the interpreter alone: a Map of `steps` iterations, each one Lambda
    Task answered in this process by a handler that returns its payload, on moto's
    interpreter with the engine's patches (the faster copy, the inline Lambda call). What a
    step of laneflow's definition costs on top of it is its own states and handlers."""
    from laneflow.adapters.engine.hooks import ACCOUNT, REGION, _backend, install_interpreter_hook, serve_execution

    install_interpreter_hook()
    task = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": {"FunctionName": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:Floor", "Payload.$": "$"},
        "ResultSelector": {"step.$": "$.Payload"},
        "End": True,
    }
    definition = {
        "StartAt": "Fan",
        "States": {
            "Fan": {
                "Type": "Map",
                "ItemsPath": "$.items",
                "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Step", "States": {"Step": task}},
                "ResultSelector": {"count.$": "States.ArrayLength($)"},
                "End": True,
            }
        },
    }
    backend = _backend()
    machine = backend.create_state_machine(
        name=f"floor-{os.getpid()}-{time.monotonic_ns()}",
        definition=json.dumps(definition),
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/floor",
    )
    items = [{"run": {"tenant": "local", "run_id": "run-floor"}, "step": {"index": i, "group": 0}} for i in range(steps)]
    best = float("inf")
    for attempt in range(2):  # the first pays the interpreter's warm-up
        name = f"floor-{attempt}"
        arn = machine.arn.replace(":stateMachine:", ":execution:") + f":{name}"
        serve_execution(arn, _Identity())  # type: ignore[arg-type]
        before = _cpu_s(os.getpid())
        execution = backend.start_execution(machine.arn, name=name, execution_input=json.dumps({"items": items}))
        while execution.status == "RUNNING":
            time.sleep(0.01)
        best = min(best, (_cpu_s(os.getpid()) - before) * 1000 / steps)
        serve_execution(arn, None)
        if execution.status != "SUCCEEDED":
            raise RuntimeError(f"the interpreter's floor run ended {execution.status}: {execution.error} {execution.cause}")
    return round(best, 2)


def store_floor(steps: int) -> float:
    """CPU ms a step of the fewest SQLite writes a durable step needs: its claim (an attempt
    row and the step's status, one transaction) and its end (the attempt's and the step's
    result, another), in WAL mode with synchronous=NORMAL as the store has them."""
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("CREATE TABLE steps (idx INTEGER PRIMARY KEY, status TEXT, result TEXT)")
        db.execute("CREATE TABLE attempts (idx INTEGER, n INTEGER, token TEXT, status TEXT, PRIMARY KEY (idx, n))")
        db.executemany("INSERT INTO steps VALUES (?, 'pending', NULL)", [(i,) for i in range(steps)])
        before = time.process_time()
        for i in range(steps):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO attempts VALUES (?, 1, ?, 'running')", (i, f"token-{i}"))
            db.execute("UPDATE steps SET status = 'running' WHERE idx = ? AND status = 'pending'", (i,))
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE attempts SET status = 'completed' WHERE idx = ? AND n = 1 AND token = ?", (i, f"token-{i}"))
            db.execute("UPDATE steps SET status = 'completed', result = ? WHERE idx = ?", (f"Done with item-{i}.", i))
            db.execute("COMMIT")
        spent = time.process_time() - before
        db.close()
    return round(spent * 1000 / steps, 3)


def make_workspace(root: Path, groups: int) -> Path:
    ws = root / "bench-ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nBenchmark workspace.\n")
    (ws / "agents" / "worker" / "agent.md").write_text(
        '---\ndescription: does one item\nstub: "Done with {item}."\n---\nYou do one item of work.\n'
    )
    entries = "".join(
        f'  - agent: worker\n    each: input.items\n    instruction: "Group {g}: handle {{item}}."\n' for g in range(groups)
    )
    (ws / "flows" / "bench.yaml").write_text(
        "description: benchmark\ninput:\n  type: object\n  properties:\n    items: {type: array}\nsteps:\n" + entries
    )
    return ws


def run_bench(groups: int, fanout: int, gate: bool = False, copies: bool = False, step_workers: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, groups)
        cfg = Settings.from_env().model_copy(update={"step_workers": step_workers})
        svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"), cfg)
        engine = local_engine(svc)
        # Warm-up: the first execution in a process pays the interpreter's imports (and, with
        # step workers, waits for its worker to start).
        warm = create_run(svc, ws, "bench", {"items": ["a", "b"]})
        engine.drive(warm.tenant, warm.id)
        pool = engine.registry.step_workers
        workers = [w.process.pid for w in pool.workers] if pool else []
        cpu_before = [_cpu_s(os.getpid()), *(_cpu_s(pid) for pid in workers)]
        load_before = load()

        run = create_run(svc, ws, "bench", {"items": [f"item-{i}" for i in range(fanout)]}, options={"gate": gate})
        retired: dict[str, list[dict[str, Any]]] = {}  # an execution the drive continued from, dropped once the next ran
        engine.on_retire = retired.__setitem__
        clock = CopyClock()
        started = time.perf_counter()
        if copies:
            with clock:
                result = engine.drive(run.tenant, run.id)
        else:
            result = engine.drive(run.tenant, run.id)
        wall = time.perf_counter() - started
        cpu = [round(_cpu_s(pid) - was, 2) for pid, was in zip([os.getpid(), *workers], cpu_before, strict=True)]
        steps = len(result.run.steps)
        statuses = Counter(str(s.status) for s in result.run.steps)
        executions = getattr(result, "executions", None) or [result.execution_arn]
        history = [e for arn in executions for e in (retired.get(arn) or engine.history(arn))]
        entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
        workers_rss = [peak_rss_mib(pid) for pid in workers]
        step_workers_module.close_all()
    loads = (load_before, load())
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu_ms = sum(cpu) * 1000 / steps
    completed = steps == groups * fanout and result.run.status == "completed"
    goals = [
        Goal("the run completed, every step", float(completed), 1.0, timed=False, floor=True),
        Goal("CPU a step, engine and step workers", round(cpu_ms, 2), CPU_MS_PER_STEP, loads=loads, unit=" ms"),
    ]
    if gate:
        goals.append(Goal(f"{steps} gated stub steps, wall", round(wall, 2), GATED_WALL_S, loads=loads, unit=" s"))
    return {
        "benchmark": "local_engine",
        "gate": gate,
        "step_workers": step_workers,
        "engine_cpu_s": cpu[0],
        "workers_cpu_s": round(sum(cpu[1:]), 2),
        "cpu_ms_per_step": round(cpu_ms, 2),
        "workers_peak_rss_mib": round(sum(workers_rss), 1),
        "peak_rss_with_workers_mib": round(rss_mib + sum(workers_rss), 1),
        "loads": list(loads),
        "state_transitions_per_step": round(entered / steps, 2),
        "groups": groups,
        "fanout": fanout,
        "steps": steps,
        "run_status": str(result.run.status),
        "step_statuses": dict(statuses),
        "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall, 1),
        "overhead_ms_per_step": round(wall * 1000 / steps, 2),
        "history_events": len(history),
        "history_events_per_step": round(len(history) / steps, 2),
        "peak_rss_mib": round(rss_mib, 1),
        "executions": len(executions),
        **(
            {
                "deepcopy_ms_per_step": round(clock.seconds * 1000 / steps, 3),
                "deepcopy_calls_per_step": round(clock.calls / steps, 1),
            }
            if copies
            else {}
        ),
        "goals": {g.name: g.verdict for g in goals},
        "goal_rows": goals,
        "machine": machine(),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "## local_engine — 10 groups x fan-out of 100, stub model, no delay",
        "",
        f"Machine: {rows[0]['machine']}. Command: `python bench/local_engine.py --write` (both gate settings, in the engine's process and with one step worker, `LANEFLOW_STEP_WORKERS=1`; one process).",
        "",
        "| figure | "
        + " | ".join(
            f"warm gate {'on' if r['gate'] else 'off'}, "
            + (f"{r['step_workers']} step worker" if r["step_workers"] else "in-process")
            for r in rows
        )
        + " |",
        "|---|" + "---|" * len(rows),
    ]
    for label, key, unit in (
        ("steps", "steps", ""),
        ("run", "run_status", ""),
        ("wall time", "wall_s", " s"),
        ("steps per second", "steps_per_s", ""),
        ("orchestration overhead per step", "overhead_ms_per_step", " ms"),
        ("state transitions per step", "state_transitions_per_step", ""),
        ("history events per step", "history_events_per_step", ""),
        ("peak memory of the engine's process (RSS)", "peak_rss_mib", " MiB"),
        ("peak memory of its step workers (RSS, summed)", "workers_peak_rss_mib", " MiB"),
        ("CPU of the engine's process", "engine_cpu_s", " s"),
        ("CPU of its step workers", "workers_cpu_s", " s"),
        ("CPU a step, both together", "cpu_ms_per_step", " ms"),
    ):
        lines.append(f"| {label} | " + " | ".join(f"{r[key]}{unit}" for r in rows) + " |")
    floors = rows[0].get("floors")
    if floors:
        interpreter, store = floors["interpreter_ms_per_step"], floors["store_ms_per_step"]
        lines += [
            "",
            "The floor under the CPU a step, measured in the same run: the interpreter alone, a Map of as many iterations"
            f" each one Lambda Task answered in-process by a handler returning its payload, {interpreter} ms a step;"
            f" the fewest SQLite writes a durable step needs (its claim and its end, two transactions), {store} ms a step."
            " What a step costs above their sum is laneflow's own: its definition's further states, its handlers"
            " (claim, workspace, prompt, records) and, with step workers, each call crossing to a worker and back.",
        ]
    loads = [x for r in rows for x in r["loads"]]
    lines += ["", f"Goals ({load_note(loads[0], max(loads), loads[-1])}):", ""]
    for r in rows:
        where = f"{r['step_workers']} step worker" if r["step_workers"] else "in-process"
        lines.append(f"Warm gate {'on' if r['gate'] else 'off'}, {where}:\n")
        lines.append(goal_table(r["goal_rows"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument("--copies", action="store_true", help="also time moto's deep copies (per step)")
    parser.add_argument(
        "--step-workers", type=int, nargs="*", default=[0, 1], help="step worker counts to measure (0: in the engine's process)"
    )
    args = parser.parse_args()
    rows = [
        run_bench(args.groups, args.fanout, gate=g, copies=args.copies, step_workers=n)
        for n in args.step_workers
        for g in (False, True)
    ]
    steps = args.groups * args.fanout
    floors = {"interpreter_ms_per_step": interpreter_floor(steps), "store_ms_per_step": store_floor(steps)}
    for row in rows:
        row["floors"] = floors
    if args.write:
        write_section(HERE / "RESULTS.md", "local_engine", markdown(rows))
    if args.json:
        print(json.dumps({"benchmark": "local_engine", "runs": [{k: v for k, v in r.items() if k != "goal_rows"} for r in rows]}))
    else:
        print(markdown(rows))
    return exit_code([g for r in rows for g in r["goal_rows"]])


if __name__ == "__main__":
    sys.exit(main())
