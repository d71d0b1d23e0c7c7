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

from benchlib import cpu_s as _cpu_s
from benchlib import machine, write_section

from laneflow.adapters.engine import moto_fastcopy
from laneflow.adapters.engine import step_workers as step_workers_module
from laneflow.adapters.store import open_store
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent


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

        run = create_run(svc, ws, "bench", {"items": [f"item-{i}" for i in range(fanout)]}, options={"gate": gate})
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
        history = [e for arn in executions for e in engine.history(arn)]
        entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
        step_workers_module.close_all()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "benchmark": "local_engine",
        "gate": gate,
        "step_workers": step_workers,
        "engine_cpu_s": cpu[0],
        "workers_cpu_s": round(sum(cpu[1:]), 2),
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
        "goal": "1,000 steps in under 8 s on 2 cores",
        "goal_met": steps == groups * fanout and result.run.status == "completed" and wall < 8,
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
        ("peak memory (process RSS)", "peak_rss_mib", " MiB"),
        ("CPU of the engine's process", "engine_cpu_s", " s"),
        ("CPU of its step workers", "workers_cpu_s", " s"),
    ):
        lines.append(f"| {label} | " + " | ".join(f"{r[key]}{unit}" for r in rows) + " |")
    lines.append(f"| goal: {rows[0]['goal']} | " + " | ".join("met" if r["goal_met"] else "NOT met" for r in rows) + " |")
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
    if args.write:
        write_section(HERE / "RESULTS.md", "local_engine", markdown(rows))
    if args.json:
        print(json.dumps({"benchmark": "local_engine", "runs": rows}))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
