"""Benchmark: what the warm gate saves, against the local Messages API imitation.

For fan-outs of N = 5, 20 and 100 steps of one agent (a stable prefix of 4,096+ tokens,
time to first token 400 ms), each run once with the gate on and once off, through the real
definition, the Claude executor and the real anthropic SDK over HTTP:
- cache-write and cache-read tokens (from the imitation's totals),
- the prefix cost, gate off / gate on, next to the theoretical limit
  1.25N / (1.25 + 0.1(N - 1)): what N cold prefixes cost against one cold and N - 1 warm,
- the gate-on prefix cost in dollars, from the tokens each step recorded (its first model
  call) at the catalog's prices, against the formula's `input price x prefix x (1.25 +
  0.1(N - 1))`, the prefix being the most any step sent as cached: a second cold prefix, a
  sibling that read nothing or a price off its multiple fails it,
- the delay between the lead's first stream event and each sibling's start (median, max),
  and where the last sibling's start went: when the engine handed its call to a step
  worker, when the worker claimed it, when its first model request began (`--repeat K`
  gated runs of each size, listed one by one),
- the floor under those starts for the largest N (`sdk_floor.py`): its N - 1 siblings'
  requests sent through the SDK alone from as many processes as there are step workers,
  with nothing else running (no engine, no store, no prompt building),
- wall time.

    python bench/warm_gate.py [--sizes 5 20 100] [--repeat K] [--step-workers N] [--json] [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import sdk_floor
from benchlib import Goal, exit_code, goal_table, load, machine, write_section
from pydantic import SecretStr

from laneflow.adapters.engine import step_workers as step_workers_module
from laneflow.adapters.engine.local import LocalEngine
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.pricing import Price, catalog
from laneflow.domain.records import Run
from laneflow.entrypoints.cli import step_workers as default_step_workers
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent
MODEL = "claude-sonnet-4-6"
TTFT_MS = 400
KEY = "sk-bench-not-a-real-key"


class RemoteImitation:
    """The imitation in a process of its own, as the real API is remote: its streaming
    threads do not share the engine's interpreter lock."""

    def __init__(self, ttft_ms: int, token_ms: float):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "laneflow_dev.imitation",
                "--port",
                "0",
                "--ttft-ms",
                str(ttft_ms),
                "--token-ms",
                str(token_ms),
                "--api-key",
                KEY,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.key = KEY  # the one key it takes
        assert self.proc.stdout is not None  # stdout=PIPE
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.proc.kill()
            raise RuntimeError("the imitation server did not start")

    def _call(self, method: str, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        answer: dict[str, Any] = json.loads(body) if body else {}
        return answer

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def reset(self) -> None:
        self._call("POST", "/stats/reset")

    def __enter__(self) -> RemoteImitation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def make_workspace(root: Path) -> Path:
    ws = root / "gate-ws"
    (ws / "agents" / "analyst").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "knowledge").mkdir()
    (ws / "AGENTS.md").write_text(f"---\nmodel: {MODEL}\n---\nBenchmark workspace for the warm gate.\n")
    (ws / "agents" / "analyst" / "agent.md").write_text(
        "---\ndescription: analyses one item\ntools: [read_file]\n---\nYou are an analyst. Answer from the primer.\n"
    )
    facts = [f"Fact {i}: the reference value of item {i} is {i * 37 % 101} units, measured twice." for i in range(400)]
    (ws / "knowledge" / "primer.md").write_text("# Primer\n\n" + "\n".join(facts) + "\n")
    (ws / "flows" / "fanout.yaml").write_text(
        "description: fan-out\ninput:\n  type: object\n  properties:\n    items: {type: array}\n"
        'steps:\n  - agent: analyst\n    each: input.items\n    instruction: "Analyse {item}."\n'
    )
    return ws


class Deliveries:
    """When the engine's process handed each step's RunStep call to a step worker (wall
    clock, by run and step index): the engine's part of a sibling's start, apart from the
    worker's (its claim, the step's `started_at`) and the model request's (its first call's
    `at`)."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, int], dt.datetime] = {}
        self._original = step_workers_module.StepWorkers.invoke

    def __enter__(self) -> Deliveries:
        original, at = self._original, self.at

        def invoke(
            pool: step_workers_module.StepWorkers, function: str, payload: Any
        ) -> dict[str, Any] | None:  # the method it stands in for
            if isinstance(payload, dict) and "step" in payload:
                at[(str(payload["run"]["run_id"]), int(payload["step"]["index"]))] = dt.datetime.now(dt.UTC)
            return original(pool, function, payload)

        setattr(step_workers_module.StepWorkers, "invoke", invoke)  # noqa: B010 (mypy refuses assigning a method)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(step_workers_module.StepWorkers, "invoke", self._original)  # noqa: B010


def spread_ms(times: list[dt.datetime], since: dt.datetime) -> dict[str, Any]:
    """Median, p90 and max of `times` after `since`, in ms."""
    delays = sorted((t - since).total_seconds() * 1000 for t in times)
    return {
        "median": round(statistics.median(delays), 1),
        "p90": round(delays[int(0.9 * (len(delays) - 1))], 1),
        "max": round(delays[-1], 1),
    }


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def one_run(
    svc: Services, engine: LocalEngine, api: RemoteImitation, ws: Path, n: int, gate: bool, deliveries: Deliveries | None = None
) -> dict[str, Any]:
    api.reset()
    run = create_run(svc, ws, "fanout", {"items": [f"item-{i}" for i in range(n)]}, options={"gate": gate})
    started = time.perf_counter()
    final = engine.drive(run.tenant, run.id, tick_s=0.02).run
    wall = time.perf_counter() - started
    stats = api.stats()
    out: dict[str, Any] = {
        "n": n,
        "gate": gate,
        "status": str(final.status),
        "wall_s": round(wall, 3),
        "cache_writes": stats["cache_writes"],
        "cache_reads": stats["cache_reads"],
        "cache_write_tokens": stats["cache_write_tokens"],
        "cache_read_tokens": stats["cache_read_tokens"],
    }
    if gate:
        price = catalog().price(MODEL)
        assert price is not None, MODEL
        out["dollars"] = gate_on_prefix_dollars(final, n, price)
        lead, siblings = final.steps[0], final.steps[1:]
        opened = [e for e in lead.events if e.type == "gate" and e.data and "opened_at" in e.data]
        if opened:
            gate_data = cast(dict[str, Any], opened[0].data)  # the filter above kept only events with data
            first_event = ts(gate_data["opened_at"])
            out["tokens_released_ms"] = round((ts(gate_data["released_at"]) - first_event).total_seconds() * 1000, 1)
            starts = [ts(cast(str, s.started_at)) for s in siblings]  # released siblings have started
            claimed = spread_ms(starts, first_event)
            out["release_ms_median"], out["release_ms_p90"], out["release_ms_max"] = (
                claimed["median"],
                claimed["p90"],
                claimed["max"],
            )
            out["siblings_before_first_event"] = sum(1 for t in starts if t < first_event)
            # Where a sibling's start goes: the engine hands its call to a worker, the worker
            # claims it (above), the step's first model request begins.
            handed = [deliveries.at[(final.id, s.index)] for s in siblings if deliveries and (final.id, s.index) in deliveries.at]
            if len(handed) == len(siblings):
                out["delivered_ms"] = spread_ms(handed, first_event)
            firsts = [min(s.calls, key=lambda c: c.n) for s in siblings if s.calls]
            if len(firsts) == len(siblings):
                out["requested_ms"] = spread_ms([ts(c.at) for c in firsts], first_event)
                # Written whole: the transport's own trace of each request's body sent.
                if all(c.sent_ms is not None for c in firsts):
                    written = [ts(c.at) + dt.timedelta(milliseconds=cast(int, c.sent_ms)) for c in firsts]
                    out["written_ms"] = spread_ms(written, first_event)
        # By the imitation's own clock, apart from what laneflow recorded: when the lead's
        # first event went out, and when each sibling's request had arrived whole (so was
        # written by then).
        if stats.get("first_events") and len(stats.get("arrivals", [])) == n:
            lead_event = stats["first_events"][0]
            arrived = sorted(stats["arrivals"])[1:]  # the lead's request came first, alone
            out["arrived_ms"] = spread_ms(
                [dt.datetime.fromtimestamp(a, dt.UTC) for a in arrived], dt.datetime.fromtimestamp(lead_event, dt.UTC)
            )
            out["requests_before_first_event"] = sum(1 for a in arrived if a < lead_event)
    return out


def _starts(r: dict[str, Any]) -> dict[str, Any]:
    """A gated run's sibling starts after its lead's first event, in ms: claimed (median,
    max), handed to a worker (max), first model request begun (max)."""
    return {
        "claimed_median": r.get("release_ms_median"),
        "claimed_max": r.get("release_ms_max"),
        "delivered_max": r.get("delivered_ms", {}).get("max"),
        "requested_max": r.get("requested_ms", {}).get("max"),
        "arrived_max": r.get("arrived_ms", {}).get("max"),
        "written_max": r.get("written_ms", {}).get("max"),
        "requests_before_first_event": r.get("requests_before_first_event"),
        "wall_s": r["wall_s"],
    }


def gate_on_prefix_dollars(run: Run, n: int, price: Price) -> dict[str, Any]:
    """What the run's steps paid for the stable prefix (each step's first model call, as the
    store recorded it), against the formula for one cold prefix and N - 1 warm reads."""
    firsts = [min(step.calls, key=lambda call: call.n) for step in run.steps if step.calls]
    prefix = max((c.tokens.cache_write + c.tokens.cache_read for c in firsts), default=0)
    paid = sum(c.tokens.cache_write * price.cache_write_5m + c.tokens.cache_read * price.cache_read for c in firsts) / 1e6
    formula = price.input * prefix * (1.25 + 0.1 * (n - 1)) / 1e6
    return {
        "steps_with_a_call": len(firsts),
        "prefix_tokens_sent": prefix,
        "prefix_usd": round(paid, 6),
        "formula_usd": round(formula, 6),
        "cold_usd": round(n * prefix * price.cache_write_5m / 1e6, 6),
        "vs_formula_pct": round(100 * (paid - formula) / formula, 2) if formula else None,
    }


def prefix_cost(r: dict[str, Any], prefix_tokens: int) -> float:
    """The prefix's cost in units of one uncached prefix: writes at 1.25, reads at 0.1."""
    return float((1.25 * r["cache_write_tokens"] + 0.1 * r["cache_read_tokens"]) / prefix_tokens)


def services(
    root: Path, api: RemoteImitation, step_workers: int, executor: type[AnthropicExecutor] = AnthropicExecutor
) -> Services:
    """A SQLite store under `root`, with `executor` (the Claude executor) calling the imitation."""
    settings = Settings(
        anthropic_api_key=SecretStr(api.key),
        anthropic_base_url=api.url,
        capture_dir=str(root / "captures"),
        step_workers=step_workers,
        prefix_registry=False,  # each run measures its own gate: the imitation forgets its cache between runs, the registry would not
    )
    svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"), settings)
    svc.executors["anthropic"] = executor(api_key=api.key, base_url=api.url)
    return svc


def written_limit_ms(n: int) -> float:
    """How soon after the lead's first event the last sibling's request is written: 150 ms at
    N = 100 (two cores, default workers), 50 ms at N = 20 and below."""
    return 50.0 if n <= 20 else 150.0


def judge(rows: list[dict[str, Any]], loads: tuple[float, float]) -> list[Goal]:
    """The goals: counts (judged whatever the load) and times (unmeasured on a busy machine)."""
    goals: list[Goal] = []
    for r in rows:
        n, on, runs = r["n"], r["gate_on"], r["gate_on"].get("runs", [])
        goals.append(Goal(f"N={n}: cold prefixes, gate on (the imitation's count)", on["cache_writes"], 1, timed=False))
        pct = on["dollars"]["vs_formula_pct"]
        goals.append(
            Goal(f"N={n}: gate-on prefix paid vs formula, % off", abs(pct) if pct is not None else 1e9, 1.0, timed=False)
        )
        goals.append(Goal(f"N={n}: gate-off / gate-on prefix cost, both measured", r["cost_ratio"], 1.0, timed=False, floor=True))
        early = max(
            (x["requests_before_first_event"] for x in runs if x.get("requests_before_first_event") is not None), default=1e9
        )
        goals.append(Goal(f"N={n}: sibling requests before the lead's first event", early, 0, timed=False))
        written = [x["written_max"] for x in runs if x.get("written_max") is not None]
        goals.append(
            Goal(
                f"N={n}: last sibling request written after the lead's first event, worst of {len(written)} runs, ms",
                max(written) if len(written) == len(runs) and written else 1e9,
                written_limit_ms(n),
                loads=loads,
            )
        )
        goals.append(
            Goal(
                f"N={n}: tokens released after the lead's first event, ms", on.get("tokens_released_ms", 1e9), 100.0, loads=loads
            )
        )
    return goals


def run_bench(sizes: list[int], step_workers: int = 1, repeat: int = 1) -> dict[str, Any]:
    before = load()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, RemoteImitation(ttft_ms=TTFT_MS, token_ms=1) as api, Deliveries() as deliveries:
        root = Path(tmp)
        ws = make_workspace(root)
        svc = services(root, api, step_workers)
        engine = local_engine(svc)
        one_run(svc, engine, api, ws, 2, True)  # warm-up: imports, the interpreter, the HTTP pool
        for n in sizes:
            on = one_run(svc, engine, api, ws, n, True, deliveries)
            # More gated runs of this size (--repeat): the spread of their starts between runs.
            again = [one_run(svc, engine, api, ws, n, True, deliveries) for _ in range(repeat - 1)]
            on["runs"] = [_starts(r) for r in [on, *again]]
            off = one_run(svc, engine, api, ws, n, False)
            prefix = on["cache_write_tokens"]  # the gate on writes the prefix exactly once
            theory = 1.25 * n / (1.25 + 0.1 * (n - 1))
            ratio = prefix_cost(off, prefix) / prefix_cost(on, prefix)
            rows.append(
                {
                    "n": n,
                    "prefix_tokens": prefix,
                    "gate_on": on,
                    "gate_off": off,
                    "cost_ratio": round(ratio, 3),
                    "theoretical_ratio": round(theory, 3),
                    "ratio_vs_limit_pct": round(100 * (ratio - theory) / theory, 2),
                }
            )
        # The floor under the largest fan-out's sibling starts: the same requests, the SDK alone.
        request = sdk_floor.warm_gate_request()
        floor = sdk_floor.measure(api, request, max(sizes) - 1, max(1, step_workers), max(3, repeat))
        floor["raw_floor"] = sdk_floor.measure(api, request, max(sizes) - 1, max(1, step_workers), max(3, repeat), raw=True)
    after = load()
    goals = judge(rows, (before, after))
    return {
        "benchmark": "warm_gate",
        "model": MODEL,
        "ttft_ms": TTFT_MS,
        "step_workers": step_workers,
        "rows": rows,
        "floor": floor,
        "goals": [dataclasses.asdict(g) | {"verdict": g.verdict} for g in goals],
        "exit_code": exit_code(goals),
        "machine": machine(),
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"## warm_gate — fan-outs of one agent on the Messages API imitation (ttft {r['ttft_ms']} ms, {r['model']})",
        "",
        f"Machine: {r['machine']}. Command: `python bench/warm_gate.py --write` ({r['step_workers']} step worker(s), as `laneflow run` has here: one per core up to four; `--step-workers 0` runs every step in the engine's process).",
        "",
        "| N | prefix tokens | gate | cache writes | write tokens | cache reads | read tokens | wall s | tokens released after the lead's first event, ms | sibling starts after it: median / p90 / max ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        for key in ("gate_on", "gate_off"):
            g = row[key]
            delay = (
                f"{g['release_ms_median']} / {g['release_ms_p90']} / {g['release_ms_max']}" if "release_ms_median" in g else "—"
            )
            lines.append(
                f"| {row['n']} | {row['prefix_tokens']} | {'on' if g['gate'] else 'off'} | {g['cache_writes']} | {g['cache_write_tokens']} "
                f"| {g['cache_reads']} | {g['cache_read_tokens']} | {g['wall_s']} | {g.get('tokens_released_ms', '—')} | {delay} |"
            )
    lines += [
        "",
        "Where a gated sibling's start goes, per run, in ms after the lead's first event (the last sibling's):"
        " the engine hands its RunStep call to a step worker, the worker claims it, its first model request begins.",
        "",
        "| N | run | handed to a worker | claimed (median / max) | request begun | request written whole | request arrived whole (the imitation's clock) | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        for k, one in enumerate(row["gate_on"].get("runs", []), 1):
            lines.append(
                f"| {row['n']} | {k} | {one['delivered_max'] if one['delivered_max'] is not None else '—'} "
                f"| {one['claimed_median']} / {one['claimed_max']} | {one['requested_max']} | {one.get('written_max', '—')} | {one.get('arrived_max', '—')} | {one['wall_s']} |"
            )
    floor = r["floor"]
    lines += [
        "",
        f"The floor under those starts (`bench/sdk_floor.py`): the {floor['n']} siblings' requests of the largest fan-out sent"
        f" through the anthropic SDK alone, from {floor['processes']} process(es) (as many as the step workers), connections"
        " already open, all at one instant, with nothing else running: ms after that instant.",
        "",
        "| burst | how | clients ready before the instant | median request written | last request written | clients' CPU to their last | imitation's CPU (to the streams' ends) |",
        "|---|---|---|---|---|---|---|",
    ]
    for how, each in (("prebuilt bytes, raw sockets", floor.get("raw_floor", {"bursts": []})), ("the anthropic SDK", floor)):
        for k, b in enumerate(each["bursts"], 1):
            ready = f"yes ({b['ready_ms_before']} ms)" if b.get("ready") else "NO: not a floor"
            lines.append(
                f"| {k} | {how} | {ready} | {b['median_ms']} | {b['last_ms']} | {b['client_cpu_ms']} ms | {b['imitation_cpu_ms']} ms |"
            )
    lines += [
        "",
        "| N | prefix cost, measured gate off / gate on | theoretical limit 1.25N/(1.25+0.1(N-1)) | measured vs limit |",
        "|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['n']} | {row['cost_ratio']} | {row['theoretical_ratio']} | {row['ratio_vs_limit_pct']:+.2f}% |")
    lines += [
        "",
        "| N | prefix tokens sent | gate-on prefix paid (steps' tokens x catalog prices) | formula: input x prefix x (1.25 + 0.1(N-1)) | paid vs formula |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        d = row["gate_on"]["dollars"]
        shown = f"{d['vs_formula_pct'] + 0.0:+.2f}%" if d["vs_formula_pct"] is not None else "—"  # no "-0.00"
        lines.append(f"| {row['n']} | {d['prefix_tokens_sent']} | ${d['prefix_usd']:.6f} | ${d['formula_usd']:.6f} | {shown} |")
    goals = [Goal(**{k: v for k, v in g.items() if k != "verdict"}) for g in r["goals"]]
    lines += ["", goal_table(goals).rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument(
        "--step-workers",
        type=int,
        default=None,
        help="step worker processes (0: every step in the engine's process; default: the CLI's, one per core up to four)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="gated runs of each size (their sibling starts are listed one by one)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    workers = args.step_workers if args.step_workers is not None else default_step_workers(None, Settings())
    result = run_bench(args.sizes, step_workers=workers, repeat=max(1, args.repeat))
    if args.write:
        write_section(HERE / "RESULTS.md", "warm_gate", markdown(result))
    print(json.dumps(result) if args.json else markdown(result))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
