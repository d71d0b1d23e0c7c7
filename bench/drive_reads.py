"""Benchmark: what a drive's decisions read from the store, for 100 groups of 10 stub steps.

NextGroup and SettleGroup decide what runs next; this counts the store reads they make (calls
of `get_steps` and `get_group_outline`, and the rows those return) over a whole run on the
embedded engine. RunStep's own reads are not counted (one step each).

    python bench/drive_reads.py [--groups 100] [--fanout 10] [--json]
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
        started = time.perf_counter()
        result = engine.drive(run.tenant, run.id)
        wall = time.perf_counter() - started
    return {
        "benchmark": "drive_reads",
        "groups": groups,
        "fanout": fanout,
        "run_status": str(result.run.status),
        "wall_s": round(wall, 2),
        **dict(reads),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run_bench(args.groups, args.fanout), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
