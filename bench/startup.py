"""Benchmark: how soon the CLI's commands start and end, as whole processes.

Embedded defaults (an SQLite store in a temporary folder, the stub model), each command run
as a person runs it (the `laneflow` console script beside this Python, else `python -m
laneflow.entrypoints.cli`), `--repeat` times after one warm-up:
- `run WORKSPACE FLOW` of a one-step stub flow (a workspace made here), start to exit;
- `show RUN` (that run) and `runs`, start to exit;
- `demo` (the newsroom example, a fresh store each time): from launch to its first step's
  start as the store records it, then the demo is stopped (SIGTERM: it leaves its run
  resumable); beside it, when its run was created (how long it waited for its drive);
- `run` of the one-step flow with `--step-workers` 0, 1 and 2: what the default (none, for a
  run that small) saves.

Wall times are the minimum and median; CPU is user + system of the command and its step
workers (this process is their subreaper, so they are counted once they end), the median.
Each command is run once more under `python -X importtime`: how many modules it imported,
and which of the heavy packages (`HEAVY`) among them. The machine's 1-minute load before and
after each command's runs stands beside its figures: a goal measured while it was above the
cores is unmeasured (benchlib). Exit code 1 when a measured goal is missed.

    python bench/startup.py [--repeat 5] [--json] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import re
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchlib import Goal, cpu_s, exit_code, goal_table, load, machine, write_section

HERE = Path(__file__).resolve().parent

# The packages whose presence says a command imported more than it needed.
HEAVY = (
    "moto",
    "boto3",
    "botocore",
    "anthropic",
    "mcp",
    "aws_lambda_powertools",
    "aws_xray_sdk",
    "httpx",
    "jsonschema",
    "antlr4",
    "werkzeug",
    "rich",
)

# The goals: median seconds (the demo's: launch to its first step's start).
LIMITS = {"run": 1.5, "show": 0.5, "runs": 0.5, "demo": 0.5}

DEMO_WAIT_S = 30.0  # a demo whose first step has not started by then has failed

PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Figures:
    """One command's runs: wall seconds each, CPU seconds each, the loads around them."""

    command: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    loads: tuple[float, float] = (0.0, 0.0)
    created: list[float] = field(default_factory=list)  # the demo's: launch to its run's creation
    modules: int = 0
    heavy: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return round(statistics.median(self.walls), 3)

    def row(self) -> str:
        cpu = f"{statistics.median(self.cpus):.3f} s" if self.cpus else "—"
        heavy = ", ".join(self.heavy) or "none"
        return (
            f"| `{self.command}` | {min(self.walls):.3f} s | {self.median:.3f} s | {cpu} | {self.modules} | {heavy} |"
            f" {self.loads[0]:.2f} / {self.loads[1]:.2f} |"
        )


def laneflow() -> list[str]:
    """The command a person runs: the console script of this Python's environment."""
    script = Path(sys.executable).parent / "laneflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "laneflow.entrypoints.cli"]


def environment() -> dict[str, str]:
    """This process's environment less the settings that would change the defaults measured."""
    return {k: v for k, v in os.environ.items() if k not in ("LANEFLOW_STEP_WORKERS", "LANEFLOW_STORE", "LANEFLOW_MODEL")}


def workspace(root: Path) -> Path:
    """A workspace with one flow of one stub step."""
    ws = root / "ws"
    (ws / "agents" / "writer").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nWrite plainly.\n")
    (ws / "agents" / "writer" / "agent.md").write_text("---\ndescription: The writer.\n---\nYou are the writer.\n")
    (ws / "flows" / "one.yaml").write_text('steps:\n  - agent: writer\n    instruction: "Write one line."\n')
    return ws


def become_subreaper() -> bool:
    """Orphaned descendants (a drive's step workers) come back to this process, so their CPU
    is counted in its children's usage once they are reaped."""
    try:
        return bool(ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux: the workers' CPU goes uncounted
        return False


def reap(timeout_s: float = 10.0) -> None:
    """Wait for every descendant left (step workers end once their engine has)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: Sequence[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of it and its descendants, stdout) of one command."""
    before = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, check=False, timeout=120)
    wall = time.perf_counter() - started
    reap()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, children_cpu() - before, done.stdout


def repeated(name: str, argv: Sequence[str], repeat: int) -> Figures:
    timed(argv)  # warm-up: the file cache, compiled modules
    figures = Figures(name)
    first = load()
    for _ in range(repeat):
        wall, cpu, _ = timed(argv)
        figures.walls.append(round(wall, 3))
        figures.cpus.append(round(cpu, 3))
    figures.loads = (first, load())
    return figures


def imported(args: Sequence[str], *, until_step: Path | None = None) -> list[str]:
    """The modules `laneflow ARGS` imports (`-X importtime`: its own process only, not its
    step workers), in order; with `until_step`, a demo's until its first step started (then
    it is stopped)."""
    command = [sys.executable, "-X", "importtime", "-m", "laneflow.entrypoints.cli", *args]
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, env=environment(), stdout=subprocess.DEVNULL, stderr=err, text=True)
        if until_step is not None:
            first_step(until_step, time.time(), process)
            stop(process)
        else:
            process.wait(120)
        reap()
        err.seek(0)
        return [m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", err.read(), re.M)]


def heavy_of(modules: list[str]) -> list[str]:
    tops = {name.split(".")[0] for name in modules}
    return [name for name in HEAVY if name in tops]


def _epoch(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def first_step(db: Path, launched: float, process: subprocess.Popen[Any]) -> tuple[float, float, float]:
    """(launch to its run's creation, launch to its first step's start, the process's CPU
    seconds then), read from the demo's store as it runs."""
    deadline = time.monotonic() + DEMO_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the demo exited {process.returncode} before its first step started")
        cpu = cpu_s(process.pid)
        found = _first_start(db)
        if found is not None:
            created, started = found
            return created - launched, started - launched, cpu
        time.sleep(0.005)
    raise RuntimeError(f"the demo's first step had not started after {DEMO_WAIT_S:.0f} s")


def _first_start(db: Path) -> tuple[float, float] | None:
    """(the run's creation, its first step's start) as epoch seconds, once a step started:
    read from the SQLite store's file as the demo writes it, read-only."""
    if not db.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            created = conn.execute("SELECT MIN(created_at) FROM runs").fetchone()[0]
            started = conn.execute("SELECT MIN(started_at) FROM steps WHERE started_at IS NOT NULL").fetchone()[0]
    except sqlite3.Error:  # not made yet, or its tables are being made
        return None
    return (_epoch(created), _epoch(started)) if created and started else None


def stop(process: subprocess.Popen[Any]) -> None:
    process.send_signal(signal.SIGTERM)  # as a person's Ctrl-C: the run is left resumable
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def demo(root: Path, repeat: int) -> Figures:
    """The demo's first-step figures (its CPU: its own process's, until then)."""
    figures = Figures("demo")
    first = load()
    for i in range(repeat + 1):  # the first is the warm-up
        db = root / f"demo-{i}" / "laneflow.db"
        launched = time.time()
        process = subprocess.Popen(
            [*laneflow(), "demo", "--store", f"sqlite:///{db}"],
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            created, started, cpu = first_step(db, launched, process)
        finally:
            stop(process)
            reap()
        if i:
            figures.created.append(round(created, 3))
            figures.walls.append(round(started, 3))
            figures.cpus.append(round(cpu, 3))
    figures.loads = (first, load())
    return figures


@contextlib.contextmanager
def bench_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="laneflow-startup-") as tmp:
        yield Path(tmp)


def run_bench(repeat: int) -> dict[str, Any]:
    become_subreaper()
    with bench_root() as root:
        store = ["--store", f"sqlite:///{root / 'store' / 'laneflow.db'}"]
        run_args = ["run", str(workspace(root)), "one", *store, "--quiet"]
        run = repeated("run WORKSPACE FLOW", [*laneflow(), *run_args], repeat)
        run_id = json.loads(timed([*laneflow(), *run_args, "--json"])[2])["id"]
        show_args, runs_args = ["show", run_id, *store], ["runs", *store]
        show = repeated("show RUN", [*laneflow(), *show_args], repeat)
        runs = repeated("runs", [*laneflow(), *runs_args], repeat)
        first = demo(root, repeat)
        workers = {
            n: repeated(f"run --step-workers {n}", [*laneflow(), *run_args, "--step-workers", str(n)], repeat) for n in (0, 1, 2)
        }
        for figures, args in ((run, run_args), (show, show_args), (runs, runs_args)):
            modules = imported(args)
            figures.modules, figures.heavy = len(set(modules)), heavy_of(modules)
        db = root / "demo-imports" / "laneflow.db"
        modules = imported(["demo", "--store", f"sqlite:///{db}"], until_step=db)
        first.modules, first.heavy = len(set(modules)), heavy_of(modules)
    return {"repeat": repeat, "commands": [run, show, runs, first], "workers": workers}


def goals(out: dict[str, Any]) -> list[Goal]:
    run, show, runs, first = out["commands"]
    return [
        Goal("`run` of a one-step stub flow, median", run.median, LIMITS["run"], loads=run.loads),
        Goal("`show RUN`, median", show.median, LIMITS["show"], loads=show.loads),
        Goal("`runs`, median", runs.median, LIMITS["runs"], loads=runs.loads),
        Goal("`demo`: launch to its first step's start, median", first.median, LIMITS["demo"], loads=first.loads),
    ]


def markdown(out: dict[str, Any]) -> str:
    run, show, runs, first = out["commands"]
    lines = [
        f"## startup — the CLI's commands as whole processes, SQLite store, stub model ({out['repeat']} runs each)",
        "",
        f"Machine: {machine()}. Command: `python bench/startup.py --write` ({dt.date.today().isoformat()}).",
        "",
        "| command | wall, min | wall, median | CPU, median | modules imported | heavy packages among them | load before / after |",
        "|---|---|---|---|---|---|---|",
        run.row(),
        show.row(),
        runs.row(),
        first.row().replace("| `demo` |", "| `demo`: launch to its first step's start |", 1),
        "",
        f"The demo's CPU is its own process's until its first step started. Its run was created"
        f" {statistics.median(first.created):.3f} s after launch (median) and waited"
        f" {first.median - statistics.median(first.created):.3f} s, queued, for its drive's first step.",
        "",
        "| `run` of one stub step | wall, median | CPU with its step workers, median | load before / after |",
        "|---|---|---|---|",
        *(
            f"| `--step-workers {n}` | {f.median:.3f} s | {statistics.median(f.cpus):.3f} s | {f.loads[0]:.2f} / {f.loads[1]:.2f} |"
            for n, f in out["workers"].items()
        ),
        "",
        goal_table(goals(out), " s"),
    ]
    return "\n".join(lines)


def as_json(out: dict[str, Any]) -> dict[str, Any]:
    return {
        **out,
        "commands": [asdict(f) for f in out["commands"]],
        "workers": {n: asdict(f) for n, f in out["workers"].items()},
        "goals": [{"name": g.name, "measured": g.measured, "limit": g.limit, "verdict": g.verdict} for g in goals(out)],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command (default 5), after one warm-up")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the figures into bench/RESULTS.md")
    args = parser.parse_args()
    out = run_bench(args.repeat)
    print(json.dumps(as_json(out), indent=2) if args.json else markdown(out))
    if args.write:
        write_section(HERE / "RESULTS.md", "startup", markdown(out))
    return exit_code(goals(out))


if __name__ == "__main__":
    sys.exit(main())
