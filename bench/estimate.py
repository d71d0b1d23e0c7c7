"""Benchmark: how close `laneflow estimate` comes to what a run then costs and caches.

For the example newsroom flow, on claude-sonnet-4-6 through the local Messages API imitation
(the real SDK over HTTP, the real definition) and on the stub: one store per model, and the
flow run on fan-outs of 2, 5 and 10 topics in that order, each run estimated just before it
starts, from what is known then: the first from nothing (the default assumption of 400 output
tokens a turn), each later one learned from the flow's previous run (a run of another size),
as `laneflow estimate` does once a flow has run, and "told": with `--output-tokens` set to the
output per turn the previous run wrote. The registry is the one the runs keep, so a run that
starts within the cache's lifetime of the one before reads what that one wrote, and its
estimate says so. Each estimate's cache writes, reads and cold prefixes against the run's
`lanes`, and its expected cost against the run's, as a relative error.

Goals (counts: cost comes from tokens, so they are judged whatever the machine's load): every
estimate learned from a previous run within 15 % of the run it preceded; the told ones too;
every estimate's cache figures equal the run's; the first run inside its estimate's range.
Exit 1 when one is missed.

    python bench/estimate.py [--sizes 2 5 10] [--json] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import Goal, exit_code, goal_table, load, load_note, machine, span, write_section
from pydantic import SecretStr

from laneflow.adapters.store import open_store
from laneflow.domain.estimate import DEFAULT_OUTPUT_TOKENS
from laneflow.settings import Settings
from laneflow.usecases.estimate import estimate_run
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

ROOT = Path(__file__).resolve().parents[1]

TOPICS = ["tides", "kelp", "reefs", "vents", "sea ice", "plankton", "currents", "estuaries", "whales", "trenches"]


GOAL = 0.15  # an estimate learned from the flow's previous run, against the run it preceded


def _error(estimate: dict[str, Any], cost: float) -> float:
    return abs(estimate["cost_usd"]["expected"] - cost) / cost if cost else 0.0


def chain(model: str, sizes: list[int], tmp: Path) -> list[dict[str, Any]]:
    """Run the flow at each size in turn, on one store and one imitation, each estimated just
    before it starts: the first from nothing, each later one from the runs before it."""
    ws = Path(shutil.copytree(ROOT / "examples" / "newsroom", tmp / f"ws-{model}"))
    on = None if model == "stub" else model
    rows: list[dict[str, Any]] = []
    with MessagesImitation(ttft_ms=100, api_keys={"sk-bench"}) as api:
        cfg = Settings(capture_dir=str(tmp / "captures"), anthropic_api_key=SecretStr("sk-bench"), anthropic_base_url=api.url)
        svc = for_store(open_store(f"sqlite:///{tmp / f'{model}.db'}"), cfg)
        told_tokens: int | None = None  # what a person who read the previous run could pass
        for size in sizes:
            run_input = {"topics": TOPICS[:size]}
            learned = estimate_run(svc, ws, "brief", run_input, model=on).as_dict()
            told = None
            if told_tokens is not None and on is not None:
                told = estimate_run(svc, ws, "brief", run_input, model=on, output_tokens=told_tokens).as_dict()
            before = load()
            run = create_run(svc, ws, "brief", run_input, model=on)
            local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
            record = svc.store.get_run(run.tenant, run.id, detail=True).public()
            loads = (before, load())
            calls = [c for s in record["steps"] for c in s["calls"]]
            told_tokens = round(sum(c["tokens"]["output"] for c in calls) / max(1, len(calls)))
            rows.append(_row(model, size, learned, told, record, loads) | {"output_per_turn": told_tokens})
    return rows


def _row(
    model: str, size: int, learned: dict[str, Any], told: dict[str, Any] | None, record: dict[str, Any], loads: tuple[float, ...]
) -> dict[str, Any]:
    actual = {k: sum(r[k] for r in record["lanes"]) for k in ("cold_prefixes", "cache_write", "cache_read")}
    said = {k: learned["totals"]["with_gate"][k] for k in actual}
    cost = record["cost_usd"]
    return {
        "model": model,
        "size": size,
        "status": record["status"],
        "cost": cost,
        "learned_from": learned["output_learned_from"],
        "estimate": learned["cost_usd"]["expected"],
        "range": [learned["cost_usd"]["low"], learned["cost_usd"]["high"]],
        "inside": learned["cost_usd"]["low"] <= cost <= learned["cost_usd"]["high"],
        "error": _error(learned, cost),
        "told_tokens": told["output_tokens_per_turn"] if told else None,
        "estimate_told": told["cost_usd"]["expected"] if told else None,
        "error_told": _error(told, cost) if told else None,
        "warm_leads": sum(1 for lane in learned["lanes"] if (lane["lead_reads"] or "").startswith("warm now")),
        "cache_equal": said == actual,
        "said": said,
        "actual": actual,
        "loads": loads,
    }


def goals(rows: list[dict[str, Any]]) -> list[Goal]:
    """Each estimate made from something known before its run (a previous run of the flow, the
    output per turn it wrote, the stub's own answers) against that run; every estimate's cache
    figures against its run's; each model's first run against its first estimate's range."""
    out: list[Goal] = []
    for r in rows:
        where = f"{r['model']}, {r['size']} topics"
        if r["learned_from"] is not None or r["model"] == "stub":
            out.append(
                Goal(
                    f"{where}: estimate's error", round(100 * r["error"], 2), 100 * GOAL, timed=False, loads=r["loads"], unit=" %"
                )
            )
        if r["error_told"] is not None:
            told = round(100 * r["error_told"], 2)
            out.append(Goal(f"{where}: told estimate's error", told, 100 * GOAL, timed=False, loads=r["loads"], unit=" %"))
    seen = span([x for r in rows for x in r["loads"]])
    equal = sum(r["cache_equal"] for r in rows)
    out.append(Goal("estimates whose cache writes, reads and cold prefixes are the run's", equal, len(rows), False, True, seen))
    firsts = [r for r in rows if r is _first(rows, r)]
    inside = sum(r["inside"] for r in firsts)
    out.append(Goal("first runs inside their first estimate's range", inside, len(firsts), False, True, seen))
    return out


def _first(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    """The first run of `row`'s model: the flow's first, estimated from nothing."""
    return next(r for r in rows if r["model"] == row["model"])


def report(rows: list[dict[str, Any]], judged: list[Goal]) -> str:
    lines = [
        "## estimate — `laneflow estimate` made before each run, against that run (examples/newsroom `brief`)",
        "",
        f"Measured {dt.date.today().isoformat()} on {machine()}; claude-sonnet-4-6 through the Messages API imitation "
        "(ttft 100 ms), and the stub. Per model one store, the flow run at each size in turn; each estimate made just "
        "before its run from what was known then: the first from nothing (the default assumption, "
        f"{DEFAULT_OUTPUT_TOKENS} tokens a turn), each later one learned from the flow's previous run (`learned`), and "
        "`told`: with `--output-tokens` set to the output per turn the previous run wrote.",
        "",
        "| model | topics | estimated from | estimate | range | told | run cost | error | error (told) | warm leads | cache writes/reads/cold = run's | load before / after |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        source = r["learned_from"] or ("nothing (first run)" if r is _first(rows, r) else "the stub's answers")
        told = f"${r['estimate_told']:.5f} ({r['told_tokens']} a turn)" if r["estimate_told"] is not None else "—"
        lines.append(
            f"| {r['model']} | {r['size']} | {source} | ${r['estimate']:.5f} | ${r['range'][0]:.4f}-${r['range'][1]:.4f} | "
            f"{told} | ${r['cost']:.5f} | {r['error']:.1%} | "
            f"{'—' if r['error_told'] is None else format(r['error_told'], '.1%')} | {r['warm_leads']} | "
            f"{'yes' if r['cache_equal'] else 'NO ' + json.dumps(r['said']) + ' vs ' + json.dumps(r['actual'])} | "
            f"{r['loads'][0]:.2f} / {r['loads'][1]:.2f} |"
        )
    lines += [
        "",
        goal_table(judged),
        f"The goals are counts (a cost is tokens times prices), judged whatever the load; {load_note(*judged[-1].loads)}.",
        "A first estimate has nothing to learn from: its point assumes the default output, and the imitation replies in a "
        f"line (about {rows[0]['output_per_turn']} tokens), so its error (not a goal) is the output's; its range is judged. "
        "Each later run starts within the cache's lifetime of the one before and its leads read what that one wrote "
        "(`warm leads`: the lanes whose lead the estimate said would read). On the real API expect the tokenizer to differ "
        "from characters / 4 by some per cent as well (not measured here: no API key on this machine).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 5, 10], help="fan-out sizes (topics)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--write", action="store_true", help="write the section of bench/RESULTS.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("claude-sonnet-4-6", "stub"):
            rows += chain(model, args.sizes, Path(tmp) / model)
            print(json.dumps(rows[-len(args.sizes) :]), file=sys.stderr)
    judged = goals(rows)
    text = report(rows, judged)
    print(json.dumps({"rows": rows, "goals": [g.__dict__ | {"verdict": g.verdict} for g in judged]}) if args.json else text)
    if args.write:
        write_section(ROOT / "bench" / "RESULTS.md", "estimate", text)
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
