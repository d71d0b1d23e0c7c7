"""Benchmark: does a long-lived `laneflow serve` stay flat? One process drives run after run
through `LocalDrives` (serve's own drive starter: the embedded engine on its pool, each
ended execution forgotten), and the process's resident memory is read after each drive,
with its step workers' (`--step-workers`, default `serve`'s: one per core up to four; the
steps run there, so their memory is serve's too).

After `--warmup` drives (imports, caches, the first tables), `--drives` more drives of a
fan-out of `--fanout` gated stub steps each, the RSS read after every one; the figure is the
least-squares slope of those readings against the steps driven, per 1,000 steps (one
difference of two readings would be as noisy as the readings, about 0.5 MiB), with its
standard error, the readings' spread about the line, and beside it the difference of the
medians of the first and last thirds. `--keep` drives the same way but keeps every
execution in moto, as the engine did before it forgot them (the comparison, in the same
process conditions).

Goal: the slope at most 1 MiB per 1,000 steps (memory, not time: judged whatever the load).
With `--both` or `--write` the kept row must show its growth (slope above the limit): the
check that the readings can see a leak. Exit 1 when either is missed.

The warm-up is 12 drives because the store's own cache is part of it: SQLite's page cache
(2 MiB a connection by default, bounded) fills as the database grows, and this bench's
database passes it at about the 10th drive of 100 steps (~6 MB); before that, each drive
added ~190 KiB of cache pages, which is the store warming up, not the process keeping
drives. The bench calls no `gc.collect()` beyond the one before each reading, and does not
trim the C heap itself: `LocalDrives` caps malloc's arenas and hands a drive's free pages
back once it ended (adapters/engine/local.py, as `serve` does), so what it reads is what
`serve` holds.

    python bench/serve_memory.py [--drives 20] [--fanout 100] [--warmup 12] [--step-workers N] [--keep] [--json] [--write]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, write_section
from local_engine import make_workspace

from laneflow.adapters.engine.local import DriveResult, LocalDrives, LocalEngine
from laneflow.adapters.store import open_store
from laneflow.entrypoints.cli import step_workers as default_step_workers
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent
GOAL_KIB_PER_1000 = 1024


def rss_kib(pid: int | str = "self") -> int:
    """A process's resident memory now (not its peak), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def step_worker_pids() -> list[int]:
    """The step workers `serve`'s engines share (their memory is serve's too)."""
    from laneflow.adapters.engine import step_workers

    return [w.process.pid for pool in list(step_workers._pools.values()) for w in pool.workers if not w.dead.is_set()]


def _rss() -> int:
    """The process's RSS with its step workers', after a collection, in KiB."""
    gc.collect()
    return rss_kib() + sum(rss_kib(pid) for pid in step_worker_pids())


class KeepingDrives(LocalDrives):
    """LocalDrives as before it forgot: every ended execution stays in moto (all else alike)."""

    def _forget(self, engine: LocalEngine, result: DriveResult) -> None:
        pass


def run_bench(drives: int, fanout: int, warmup: int, keep: bool, step_workers: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, 1)
        svc = for_store(
            open_store(f"sqlite:///{root / 'bench.db'}"), Settings.from_env().model_copy(update={"step_workers": step_workers})
        )
        starter = (KeepingDrives if keep else LocalDrives)(lambda: local_engine(svc), pool=1)
        samples: list[int] = []  # after each drive, warm-up too
        measured: list[int] = []  # before the first measured drive and after each
        before = 0.0
        for n in range(warmup + drives):
            if n == warmup:
                before = load()
                measured.append(samples[-1] if samples else _rss())  # the last warm-up drive's
            run = create_run(svc, ws, "bench", {"items": [f"item-{i}" for i in range(fanout)]}, options={"gate": True})
            starter.start(run.tenant, run.id)
            starter.join()
            assert svc.store.get_run(run.tenant, run.id, steps=False).status == "completed"
            samples.append(_rss())
            if n >= warmup:
                measured.append(samples[-1])
        loads = [round(before, 2), round(load(), 2)]
    return {
        "benchmark": "serve_memory",
        "forgets_executions": not keep,
        "step_workers": step_workers,
        "warmup_drives": warmup,
        "drives": drives,
        "fanout": fanout,
        "loads": loads,
        "rss_mib_after_each_drive": [round(s / 1024, 1) for s in samples],
        **growth(measured, fanout),
        "machine": machine(),
    }


def growth(readings: list[int], fanout: int) -> dict[str, Any]:
    """The growth of `readings` (KiB, one before the first measured drive and one after each):
    the least-squares slope per 1,000 steps and its standard error, the readings' spread about
    the line, and the difference of the medians of the first and last thirds, per 1,000 steps."""
    steps = [n * fanout for n in range(len(readings))]
    fit = statistics.linear_regression(steps, readings)
    residuals = [y - (fit.intercept + fit.slope * x) for x, y in zip(steps, readings, strict=True)]
    spread_x = sum((x - statistics.fmean(steps)) ** 2 for x in steps)
    stderr = (sum(e * e for e in residuals) / max(1, len(readings) - 2) / spread_x) ** 0.5
    third = max(1, len(readings) // 3)
    early, late = statistics.median(readings[:third]), statistics.median(readings[-third:])
    apart = statistics.median(steps[-third:]) - statistics.median(steps[:third])
    return {
        "readings": len(readings),
        "slope_kib_per_1000_steps": round(1000 * fit.slope, 1),
        "slope_stderr_kib_per_1000_steps": round(1000 * stderr, 1),
        "residual_sd_kib": round(statistics.stdev(residuals), 1),
        "reading_range_kib": max(readings) - min(readings),
        "medians_growth_kib_per_1000_steps": round(1000 * (late - early) / apart, 1),
        "growth_mib_first_to_last": round((readings[-1] - readings[0]) / 1024, 2),
    }


def goals(rows: list[dict[str, Any]]) -> list[Goal]:
    """The forgetting row's slope under the limit; the kept row's (when measured) over it."""
    out = []
    for r in rows:
        loads = tuple(r["loads"])
        slope = r["slope_kib_per_1000_steps"]
        if r["forgets_executions"]:
            out.append(Goal("RSS slope, executions forgotten", slope, GOAL_KIB_PER_1000, timed=False, loads=loads, unit=" KiB"))
        else:
            name = "RSS slope, executions kept (the readings see a leak)"
            out.append(Goal(name, slope, GOAL_KIB_PER_1000, timed=False, floor=True, loads=loads, unit=" KiB"))
    return out


def markdown(rows: list[dict[str, Any]], judged: list[Goal]) -> str:
    first = rows[0]
    lines = [
        f"## serve_memory — {first['drives']} drives of {first['fanout']} gated stub steps in one process, after {first['warmup_drives']} warm-up drives",
        "",
        f"Machine: {first['machine']}. Command: `python bench/serve_memory.py --write` (with and without `--keep`, one process each; "
        f"{first.get('step_workers', 0)} step worker(s), whose RSS is added to the process's). RSS read after every drive; "
        "the growth is the least-squares slope of the readings after warm-up against the steps driven.",
        "",
        "| executions | RSS after each drive, MiB | readings | slope per 1,000 steps (± standard error) | spread about the line (sd) | range of the readings | first- vs last-third medians, per 1,000 steps | load before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'forgotten once ended' if r['forgets_executions'] else 'kept (`--keep`, for comparison)'} | "
            f"{', '.join(str(s) for s in r['rss_mib_after_each_drive'])} | {r['readings']} | "
            f"{r['slope_kib_per_1000_steps']} ± {r['slope_stderr_kib_per_1000_steps']} KiB | {r['residual_sd_kib']} KiB | "
            f"{r['reading_range_kib']} KiB | {r['medians_growth_kib_per_1000_steps']} KiB | "
            f"{r['loads'][0]:.2f} / {r['loads'][1]:.2f} |"
        )
    loads = [x for r in rows for x in r["loads"]]
    lines += ["", goal_table(judged), f"Memory is judged whatever the load; {load_note(loads[0], loads[-1])}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drives", type=int, default=20)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="keep ended executions (the engine before)")
    parser.add_argument("--both", action="store_true", help="measure --keep too, in a child process")
    parser.add_argument(
        "--step-workers",
        type=int,
        default=None,
        help="step worker processes (default `laneflow serve`'s: one per core up to four); their memory counts",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md (implies --both)")
    args = parser.parse_args()
    if args.step_workers is None:
        args.step_workers = default_step_workers(None, Settings())
    rows = [run_bench(args.drives, args.fanout, args.warmup, args.keep, args.step_workers)]
    if (args.both or args.write) and not args.keep:
        import subprocess

        argv = [
            sys.executable,
            __file__,
            "--keep",
            "--json",
            "--drives",
            str(args.drives),
            "--step-workers",
            str(args.step_workers),
            "--fanout",
            str(args.fanout),
            "--warmup",
            str(args.warmup),
        ]
        child = subprocess.run(argv, capture_output=True, text=True)
        if child.returncode not in (0, 1):  # 1: its own goal missed, which the row here judges again
            raise RuntimeError(f"serve_memory --keep failed: {child.stderr[-2000:]}")
        rows.append(json.loads(child.stdout)["runs"][0])
    judged = goals(rows)
    if args.write:
        write_section(HERE / "RESULTS.md", "serve_memory", markdown(rows, judged))
    if args.json:
        print(json.dumps({"benchmark": "serve_memory", "runs": rows}))
    else:
        print(markdown(rows, judged))
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
