"""Benchmark: what a sandboxed stub step costs over an unsandboxed one, on the embedded engine.

A flow of N groups of one stub step each (no delay), run through the real definition:
- unsandboxed: the step runs in the engine's process (RunStep);
- sandboxed, warm worker (the default for a run with sandboxed agents): the sandbox state
  forks a worker from the warm worker, which works in a scratch copy and relays its callbacks;
- sandboxed, fresh interpreter: the same with a new Python per step (what a warm worker saves).
The extra cost per step is the sandboxed mean minus the unsandboxed mean. Beside it: the
scratch copy of the bench's workspace alone, a bare interpreter that imports laneflow, and
one program started per isolation level (a plain subprocess; bubblewrap with no network),
which each tool call of a sandboxed step pays, and a sandboxed step that makes one real
`bash` call (a stub `tool:` line) under each isolation level (`LANEFLOW_ISOLATION`).

Goal: the sandboxed (warm worker) median at most 150 ms a step over the unsandboxed median,
both measured in this run, the modes taking turns in each repeat. A wall time: reported
unmeasured (neither met nor missed) when the machine was busy, its 1-minute load above its
cores before or after the drives. Exit 1 when it is measured and missed.

    python bench/sandbox.py [--groups 10] [--repeat 3] [--json] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, write_section

from laneflow.adapters.aws.s3 import checkout
from laneflow.adapters.engine.local import LocalEngine
from laneflow.adapters.store import open_store
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import bound, for_store

HERE = Path(__file__).resolve().parent
GOAL_MS = 150.0
BWRAP = [
    "bwrap",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--unshare-all",
    "--die-with-parent",
]


def workspace(root: Path, groups: int, sandbox: bool, bash: bool = False) -> Path:
    ws = root / f"ws-{'sandboxed' if sandbox else 'plain'}{'-bash' if bash else ''}"
    for sub in ("agents/builder/outputs", "agents/builder/memory", "knowledge", "storage", "state", "flows"):
        (ws / sub).mkdir(parents=True, exist_ok=True)
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nSandbox benchmark.\n")
    (ws / "knowledge" / "style.md").write_text("Plain words.\n" * 50)
    if bash:  # one real program per step: `bash -c true` in the step's isolation
        settings = 'tools: [bash]\nstub: "tool: bash {\\"command\\": \\"true\\"}\\n===\\nbuilt"\n'
    else:
        settings = f"sandbox: {str(sandbox).lower()}\nstub: built\n"
    (ws / "agents" / "builder" / "agent.md").write_text(f"---\n{settings}---\nYou build.\n")
    (ws / "flows" / "chain.yaml").write_text(
        "steps:\n" + "".join(f"  - agent: builder\n    instruction: Build part {i}.\n" for i in range(groups))
    )
    return ws


def drive_ms(root: Path, groups: int, sandbox: bool, warm: bool | None, isolation: str | None = None) -> float:
    store = open_store(f"sqlite:///{root / f'bench-{sandbox}-{warm}.db'}")
    extra: dict[str, Any] = {"isolation": isolation} if isolation else {}
    svc = for_store(store, Settings(capture_dir=str(root / "captures"), **extra))
    ws = workspace(root, groups, sandbox, bash=isolation is not None)
    engine = LocalEngine(svc, bind=bound, warm_sandboxes=warm)
    run = create_run(svc, ws, "chain", {})
    started = time.perf_counter()
    result = engine.drive(run.tenant, run.id, tick_s=0.005)
    took = (time.perf_counter() - started) * 1000
    assert result.run.status == "completed", (result.error, result.cause)
    store.close()
    return took / groups


def _median_ms(make: list[str] | None = None, fn: Callable[[], object] | None = None, repeat: int = 10) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        if fn is not None:
            fn()
        else:
            subprocess.run(cast(list[str], make), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def components(root: Path) -> dict[str, Any]:
    ws = workspace(root, 1, True)

    def copy() -> None:
        checkout(str(ws), scratch=True).discard()

    out: dict[str, Any] = {
        "scratch_copy_ms": round(_median_ms(fn=copy), 2),
        "workspace_files": sum(1 for p in ws.rglob("*") if p.is_file()),
        "python_importing_laneflow_ms": round(
            _median_ms([sys.executable, "-c", "import laneflow.wiring, laneflow.usecases.run_step.runner"], repeat=5), 1
        ),
        "program_subprocess_ms": round(_median_ms(["true"]), 2),
    }
    if shutil.which("bwrap"):
        try:
            out["program_bubblewrap_ms"] = round(_median_ms([*BWRAP, "true"]), 2)
        except subprocess.CalledProcessError:
            out["program_bubblewrap_ms"] = None  # bubblewrap cannot run here (user namespaces refused)
    return out


MODES: dict[str, tuple[bool, bool | None, str | None]] = {
    "unsandboxed": (False, None, None),
    "sandboxed_warm": (True, True, None),
    "sandboxed_fresh_interpreter": (True, False, None),
    "bash_bubblewrap": (True, True, "auto"),
    "bash_subprocess": (True, True, "subprocess"),
}


def run_bench(groups: int, repeat: int) -> dict[str, Any]:
    per_step: dict[str, list[float]] = {m: [] for m in MODES}
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "warmup").mkdir()
        drive_ms(root / "warmup", 2, True, True)
        for i in range(repeat):
            for mode, (sandbox, warm, isolation) in MODES.items():
                where = root / f"{mode}-{i}"
                where.mkdir()
                per_step[mode].append(drive_ms(where, groups, sandbox, warm, isolation))
        loads = [round(before, 2), round(load(), 2)]
        parts = components(root)
    med = {m: round(statistics.median(v), 1) for m, v in per_step.items()}
    return {
        "groups": groups,
        "repeat": repeat,
        "ms_per_step": med,
        "extra_ms_warm": round(med["sandboxed_warm"] - med["unsandboxed"], 1),
        "extra_ms_fresh_interpreter": round(med["sandboxed_fresh_interpreter"] - med["unsandboxed"], 1),
        "components": parts,
        "loads": loads,
    }


def goals(out: dict[str, Any]) -> list[Goal]:
    return [Goal("extra per sandboxed step, warm worker", out["extra_ms_warm"], GOAL_MS, loads=tuple(out["loads"]), unit=" ms")]


def markdown(out: dict[str, Any], judged: list[Goal]) -> str:
    m, c = out["ms_per_step"], out["components"]
    bwrap = c.get("program_bubblewrap_ms")
    lines = [
        f"## sandbox — a sandboxed stub step's start-up cost beside an unsandboxed one ({out['groups']} groups of one step, median of {out['repeat']})",
        "",
        f"Machine: {machine()}. Command: `python bench/sandbox.py --write` ({dt.date.today().isoformat()}).",
        "",
        "| figure | ms per step |",
        "|---|---|",
        f"| unsandboxed (RunStep in the engine's process) | {m['unsandboxed']} |",
        f"| sandboxed, warm worker (forked per step; the default) | {m['sandboxed_warm']} |",
        f"| sandboxed, a fresh interpreter per step | {m['sandboxed_fresh_interpreter']} |",
        f"| **extra per sandboxed step, warm worker** | **{out['extra_ms_warm']}** |",
        f"| extra per sandboxed step, fresh interpreter | {out['extra_ms_fresh_interpreter']} |",
        f"| a sandboxed step that runs one `bash` call, isolation bubblewrap (auto) | {m['bash_bubblewrap']} |",
        f"| a sandboxed step that runs one `bash` call, isolation subprocess | {m['bash_subprocess']} |",
        f"| of which: the scratch copy ({c['workspace_files']} files) | {c['scratch_copy_ms']} |",
        f"| a Python that imports laneflow (what the warm worker saves) | {c['python_importing_laneflow_ms']} |",
        f"| one program, plain subprocess (per tool call) | {c['program_subprocess_ms']} |",
        f"| one program, bubblewrap with no network (per tool call) | {bwrap if bwrap is not None else 'not available'} |",
        "",
        goal_table(judged),
        f"The drives' {load_note(*out['loads'])}.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the figures into bench/RESULTS.md")
    args = parser.parse_args()
    out = run_bench(args.groups, args.repeat)
    judged = goals(out)
    out["goals"] = [g.__dict__ | {"verdict": g.verdict} for g in judged]
    print(json.dumps(out, indent=2) if args.json else markdown(out, judged))
    if args.write:
        write_section(HERE / "RESULTS.md", "sandbox", markdown(out, judged))
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
