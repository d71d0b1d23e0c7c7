"""Benchmark: does a long-lived `laneflow serve` stay flat? One process drives run after run
through `LocalDrives` (serve's own drive starter: the embedded engine on its pool, each
ended execution forgotten), and the process's resident memory is read after each drive,
with its step workers' (`--step-workers`, default `serve`'s: one per core up to four; the
steps run there, so their memory is serve's too).

After `--warmup` drives (imports, caches, the first tables), `--drives` more drives of a
fan-out of `--fanout` gated stub steps each; the figure is the RSS growth over them per
1,000 steps. `--keep` drives the same way but keeps every execution in moto, as the engine
did before it forgot them (the comparison, in the same process conditions).

The warm-up is 12 drives because the store's own cache is part of it: SQLite's page cache
(2 MiB a connection by default, bounded) fills as the database grows, and this bench's
database passes it at about the 10th drive of 100 steps (~6 MB); before that, each drive
added ~190 KiB of cache pages, which is the store warming up, not the process keeping
drives. The bench calls no `gc.collect()` beyond the one before each reading, and does not
trim the C heap itself: `LocalDrives` caps malloc's arenas and hands a drive's free pages
back once it ended (adapters/engine/local.py, as `serve` does), so what it reads is what
`serve` holds.

    python bench/serve_memory.py [--drives 10] [--fanout 100] [--warmup 12] [--step-workers N] [--keep] [--json] [--write]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import machine, write_section
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
        samples: list[int] = []
        for _ in range(warmup + drives):
            run = create_run(svc, ws, "bench", {"items": [f"item-{i}" for i in range(fanout)]}, options={"gate": True})
            starter.start(run.tenant, run.id)
            starter.join()
            assert svc.store.get_run(run.tenant, run.id, steps=False).status == "completed"
            gc.collect()
            samples.append(rss_kib() + sum(rss_kib(pid) for pid in step_worker_pids()))
    measured = samples[warmup - 1 :]
    growth = measured[-1] - measured[0]
    per_1000 = growth * 1000 / (drives * fanout)
    return {
        "benchmark": "serve_memory",
        "forgets_executions": not keep,
        "step_workers": step_workers,
        "warmup_drives": warmup,
        "drives": drives,
        "fanout": fanout,
        "rss_mib_after_each_drive": [round(s / 1024, 1) for s in samples],
        "growth_mib": round(growth / 1024, 2),
        "growth_kib_per_1000_steps": round(per_1000, 1),
        "goal": "under 1 MiB RSS growth per 1,000 steps after warm-up, over 10 drives",
        "goal_met": per_1000 < GOAL_KIB_PER_1000,
        "machine": machine(),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    lines = [
        f"## serve_memory — {first['drives']} drives of {first['fanout']} gated stub steps in one process, after {first['warmup_drives']} warm-up drives",
        "",
        f"Machine: {first['machine']}. Command: `python bench/serve_memory.py --write` (with and without `--keep`, one process each; "
        f"{first.get('step_workers', 0)} step worker(s), whose RSS is added to the process's).",
        "",
        "| executions | RSS after each drive, MiB | growth | per 1,000 steps | goal: under 1 MiB per 1,000 steps |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'forgotten once ended' if r['forgets_executions'] else 'kept (`--keep`, for comparison)'} | "
            f"{', '.join(str(s) for s in r['rss_mib_after_each_drive'])} | {r['growth_mib']} MiB | "
            f"{r['growth_kib_per_1000_steps']} KiB | {'met' if r['goal_met'] else 'NOT met'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drives", type=int, default=10)
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
        rows.append(json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)["runs"][0])
    if args.write:
        write_section(HERE / "RESULTS.md", "serve_memory", markdown(rows))
    if args.json:
        print(json.dumps({"benchmark": "serve_memory", "runs": rows}))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
