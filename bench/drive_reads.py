"""Benchmark: what a drive's decisions read from the store, for 100 groups of 10 stub steps.

NextGroup and SettleGroup decide what runs next; this counts the store reads they make (calls
of `get_steps` and `get_group_outline`, and the rows those return) over a whole run on the
embedded engine, for a run of `--groups` groups and one of half as many. RunStep's own reads
are not counted (one step each).

Goals (counts, judged whatever the machine's load): the step reads a group makes (calls and
rows) and its outline reads (calls) in the longer run at most 1.1 times the shorter run's, so
a decision reads the group or window it decides on, not more of the run as the run grows;
and at most four reads of the group decided on (4 x `--fanout` step rows) a group. Exit 1
when one is missed. The wall time is printed with the load, and judged by no goal.

    python bench/drive_reads.py [--groups 100] [--fanout 10] [--json] [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, write_section
from local_engine import make_workspace

from laneflow.adapters.store import open_store
from laneflow.ports import Store
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


def counted(store: Store, reads: Counter[str]) -> None:
    """Count the calls and rows of the store's step reads, on the store itself."""
    for name in ("get_steps", "get_group_outline"):
        method = getattr(store, name, None)
        if method is None:
            continue

        def wrapper(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            rows = _method(*args, **kwargs)
            reads[f"{_name} calls"] += 1
            reads[f"{_name} rows"] += len(rows)
            return rows

        setattr(store, name, wrapper)


def run_bench(groups: int, fanout: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = make_workspace(root, groups)
        svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"))
        engine = local_engine(svc)
        run = create_run(svc, ws, "bench", {"items": [f"item-{i}" for i in range(fanout)]}, options={"gate": False})
        reads: Counter[str] = Counter()
        counted(svc.store, reads)
        before = load()
        started = time.perf_counter()
        result = engine.drive(run.tenant, run.id)
        wall = time.perf_counter() - started
        loads = [round(before, 2), round(load(), 2)]
    return {
        "benchmark": "drive_reads",
        "groups": groups,
        "fanout": fanout,
        "run_status": str(result.run.status),
        "wall_s": round(wall, 2),
        "loads": loads,
        **{name: reads[name] for name in READS},
    }


READS = ("get_steps calls", "get_steps rows", "get_group_outline calls", "get_group_outline rows")
GROWTH_LIMIT = 1.1  # a group's reads in the longer run over the shorter's
READS_OF_THE_GROUP = 4  # step reads of the group decided on, a group


def per_group(run: dict[str, Any], name: str) -> float:
    return float(run[name]) / float(run["groups"])


def goals(short: dict[str, Any], long: dict[str, Any]) -> list[Goal]:
    loads = (short["loads"][0], long["loads"][-1])
    out = []
    for name in ("get_steps calls", "get_steps rows", "get_group_outline calls"):
        ratio = round(per_group(long, name) / max(per_group(short, name), 1e-9), 3)
        label = f"{name} a group, {long['groups']} groups over {short['groups']}"
        out.append(Goal(label, ratio, GROWTH_LIMIT, timed=False, loads=loads, unit="x"))
    rows = round(per_group(long, "get_steps rows"), 2)
    out.append(
        Goal(
            f"get_steps rows a group, {long['groups']} groups",
            rows,
            READS_OF_THE_GROUP * long["fanout"],
            timed=False,
            loads=loads,
        )
    )
    completed = sum(r["run_status"] == "completed" for r in (short, long))
    out.append(Goal("runs completed", completed, 2, timed=False, floor=True, loads=loads))
    return out


def markdown(short: dict[str, Any], long: dict[str, Any], judged: list[Goal]) -> str:
    lines = [
        f"## drive_reads — what a drive's decisions read, {long['groups']} and {short['groups']} groups of {long['fanout']} stub steps",
        "",
        f"Machine: {machine()}. Command: `python bench/drive_reads.py --write`.",
        "",
        f"| figure | {short['groups']} groups | {long['groups']} groups | a group, {short['groups']} | a group, {long['groups']} |",
        "|---|---|---|---|---|",
        f"| run | {short['run_status']} | {long['run_status']} | | |",
    ]
    for name in READS:
        lines.append(
            f"| `{name.split()[0]}` {name.split()[1]} | {short[name]:,} | {long[name]:,} | "
            f"{per_group(short, name):.2f} | {per_group(long, name):.2f} |"
        )
    lines += [
        f"| wall time | {short['wall_s']} s | {long['wall_s']} s | | |",
        f"| load before / after | {short['loads'][0]:.2f} / {short['loads'][1]:.2f} | {long['loads'][0]:.2f} / {long['loads'][1]:.2f} | | |",
        "",
        goal_table(judged),
        f"Counts, judged whatever the load; {load_note(*judged[0].loads)} (the wall time is not judged).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    run_bench(1, 1)  # the process's one parse of the definition, which would fall on the first run's wall time
    short, long = run_bench(max(1, args.groups // 2), args.fanout), run_bench(args.groups, args.fanout)
    judged = goals(short, long)
    if args.json:
        print(json.dumps({"runs": [short, long], "goals": [g.__dict__ | {"verdict": g.verdict} for g in judged]}))
    else:
        print(markdown(short, long, judged))
    if args.write:
        write_section(Path(__file__).resolve().parent / "RESULTS.md", "drive_reads", markdown(short, long, judged))
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
