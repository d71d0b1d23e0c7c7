"""Benchmark: what a step costs the cloud services, and what reconcile reads.

1. A 100-step stub flow (one fan-out) driven through the real definition on the DynamoDB
   store (moto), on the happy path with the warm gate off and on, and with one retry per
   step: Step Functions state transitions per step (states entered, from the execution
   history) and DynamoDB write capacity units per step, counted twice: by the store from the
   sizes it writes (`DynamoStore.consumed`), and independently of the store's code by a
   `WriteMeter` on its client (laneflow_dev.capacity: every write request, refused ones
   included, charged by DynamoDB's item-size rules on the items as moto holds them before and
   after it, read with a client of its own). Where the units go: a table by store
   operation, request and item kind.
2. Reconcile's reads over 10,000 finished runs and 100 active ones, next to 1,000 finished
   and 100 active: they should grow with active runs, not with all runs. The finished runs
   are one run written by the store and cloned by moto's plain put (see clone_run_items).

    python bench/store_cost.py [--steps 100] [--finished 10000] [--json] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from benchlib import Goal, exit_code, goal_table, machine, write_section

from laneflow.wiring import for_store, local_engine
from laneflow_dev.capacity import WriteMeter

if TYPE_CHECKING:
    from laneflow.adapters.engine.local import LocalEngine
    from laneflow.adapters.store.dynamodb import DynamoStore
    from laneflow.ports import Services

HERE = Path(__file__).resolve().parent
URL = "dynamodb://laneflow-bench?bucket=laneflow-bench-blobs&region=us-east-1"

# On the happy path the store's count and the meter's may differ by this much a step (WCU):
# there the store knows the size of every item it writes (it asks for each back). Off it they
# may differ more (not a goal): the store counts a transaction's ConditionCheck as 1 KB, not
# reading the item it checks, and an update of an item it has not read on what it writes.
AGREEMENT = 0.05

WRITE_GOAL = 6.0  # write units a step, both counts, with the warm gate off and on


def make_workspace(root: Path) -> Path:
    ws = root / "cost-ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "agents" / "flaky").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nStore cost benchmark.\n")
    (ws / "agents" / "worker" / "agent.md").write_text('---\nstub: "cost: 0.001\\nDone with {item}."\n---\nYou do one item.\n')
    (ws / "agents" / "flaky" / "agent.md").write_text(
        '---\nstub:\n  - "fail: the model was overloaded"\n  - "cost: 0.001\\nDone with {item}."\n---\nYou retry once.\n'
    )
    for agent in ("worker", "flaky"):
        (ws / "flows" / f"{agent}.yaml").write_text(
            f"input:\n  type: object\n  properties:\n    items: {{type: array}}\nsteps:\n  - agent: {agent}\n    each: input.items\n"
        )
    return ws


def drive_flow(
    svc: Services, engine: LocalEngine, meter: WriteMeter | None, ws: Path, flow: str, steps: int, gate: bool = True
) -> dict[str, Any]:
    """One run of `flow` over `steps` items: its transitions and its units per step, by the
    store and, with `meter`, metered (then every write is made with the meter's reads around
    it, which slows writes: how many siblings arrive before their lead's reply depends on it)."""
    from laneflow.usecases.start_run import create_run

    store = cast("DynamoStore", svc.store)  # the benchmark's store is DynamoDB's (its consumed capacity)
    take = meter.take if meter is not None else list
    store.consumed(reset=True)
    take()
    run = create_run(svc, ws, flow, {"items": [f"item-{i}" for i in range(steps)]}, options={"gate": gate})
    created, created_writes = store.consumed(reset=True), take()
    result = engine.drive(run.tenant, run.id)
    used, writes = store.consumed(reset=True), take()
    history = engine.history(result.execution_arn)
    entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
    by_op = used.get("write", {})
    rows = []
    for (op, request, kind), row in sorted(WriteMeter.breakdown(writes).items()):
        rows.append(
            {
                "operation": op,
                "request": request,
                "item": kind,
                "writes": round(row["items"] / steps, 2),
                "table": round(row["table"] / steps, 2),
                "index": round(row["index"] / steps, 2),
                "units": round(row["units"] / steps, 2),
                "refused": row["refused"],
            }
        )
    return {
        "flow": flow,
        "gate": gate,
        "steps": steps,
        "status": str(result.run.status),
        "error": result.run.error,
        "attempts": sum(s.attempts for s in result.run.steps),
        "state_transitions_per_step": round(entered / steps, 2),
        "history_events_per_step": round(len(history) / steps, 2),
        "write_units_per_step": round(sum(by_op.values()) / steps, 2),
        "metered_write_units_per_step": round(WriteMeter.total(writes) / steps, 2) if meter is not None else None,
        "read_units_per_step": round(sum(used.get("read", {}).values()) / steps, 2),
        "write_units_by_operation_per_step": {op: round(w / steps, 2) for op, w in sorted(by_op.items()) if w},
        "metered_by_operation_per_step": rows,
        "refused_writes": sum(1 for w in writes if w.refused),
        "siblings_keeping_a_token": sum(1 for w in writes if w.kind == "gate token" and w.action == "Put"),
        "create_run_write_units": round(sum(created.get("write", {}).values()), 1),
        "create_run_metered_write_units": WriteMeter.total(created_writes),
    }


def clone_run_items(store_url: str, template_id: str, new_ids: list[str]) -> None:
    """Copy every item of a run under other run ids, through moto's own `put_item` (the
    backend's plain put, no request round trip). The store would write each run in a
    transaction, and moto deep-copies the whole table for every item of a transaction: over
    10,000 runs that setup alone outgrew 20 GB."""
    import boto3
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    table = store_url.split("://", 1)[1].split("?", 1)[0]
    client = boto3.client("dynamodb", region_name="us-east-1")
    items, start = [], None
    while True:
        page = client.scan(TableName=table, ExclusiveStartKey=start) if start else client.scan(TableName=table)
        items += [it for it in page["Items"] if template_id in json.dumps(it)]
        start = page.get("LastEvaluatedKey")
        if not start:
            break
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    text = json.dumps(items)
    for new_id in new_ids:
        for item in json.loads(text.replace(template_id, new_id)):
            backend.put_item(table, item)


def reconcile_reads(store_url: str, finished: int, active: int) -> dict[str, Any]:
    from laneflow.adapters.store import open_store
    from laneflow.adapters.workers import Liveness
    from laneflow.domain.records import Run, RunStatus, Step
    from laneflow.settings import Settings
    from laneflow.usecases.reconcile import reconcile

    store = cast("DynamoStore", open_store(store_url))
    svc = for_store(store, Settings(store_url=store_url))
    started = time.perf_counter()
    # The active runs and one finished run are written by the store while the table is
    # small; the finished one is then cloned under new ids by plain puts.
    for i in range(active):
        store.create_run(
            Run(
                id=f"run-live-{i:04d}",
                workspace="w",
                flow="f",
                status=RunStatus.running,
                drives=9,
                steps=[Step(index=0, group=0, agent="a")],
            )
        )
    store.create_run(
        Run(
            id="run-done-template", workspace="w", flow="f", status=RunStatus.completed, steps=[Step(index=0, group=0, agent="a")]
        )
    )
    clone_run_items(store_url, "run-done-template", [f"run-done-{i:06d}" for i in range(finished)])
    made = time.perf_counter() - started
    store.consumed(reset=True)
    report = reconcile(svc, Liveness(), redrive=None)
    used = store.consumed(reset=True)
    return {
        "finished_runs": finished,
        "active_runs": active,
        "reconcile_read_units": round(sum(used.get("read", {}).values()), 1),
        "reconcile_write_units": round(sum(used.get("write", {}).values()), 1),
        "runs_closed": len(report.closed),
        "setup_s": round(made, 1),
    }


def run_bench(steps: int, finished: int) -> dict[str, Any]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto import mock_aws

    from laneflow.adapters.store import open_store
    from laneflow.adapters.store.provision import init_store
    from laneflow.settings import Settings
    from laneflow_dev.capacity import laneflow_kind
    from laneflow_dev.moto_support import serialized_dynamodb

    out: dict[str, Any] = {"benchmark": "store_cost", "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp, mock_aws(), serialized_dynamodb():
        ws = make_workspace(Path(tmp))
        init_store(URL)
        store = cast("DynamoStore", open_store(URL))
        meter = WriteMeter(store.client, label=store.operation_now, kind=laneflow_kind)
        svc = for_store(store, Settings(store_url=URL, capture_dir=str(Path(tmp) / "captures")))
        engine = local_engine(svc)
        drive_flow(svc, engine, meter, ws, "worker", 2)  # warm-up
        out["happy_path"] = drive_flow(svc, engine, meter, ws, "worker", steps, gate=False)
        out["happy_path_gated"] = drive_flow(svc, engine, meter, ws, "worker", steps, gate=True)
        out["one_retry"] = drive_flow(svc, engine, meter, ws, "flaky", steps, gate=False)
        meter.close()
        out["happy_path_gated_unmetered"] = drive_flow(svc, engine, None, ws, "worker", steps, gate=True)
        out["reconcile"] = []
        for finished_runs in (finished // 10, finished):
            url = URL.replace("laneflow-bench", f"laneflow-rec-{finished_runs}")
            init_store(url)
            out["reconcile"].append(reconcile_reads(url, finished_runs, 100))
            # Gone before the next: every transaction reconcile writes copies each table it names.
            boto3.client("dynamodb", region_name="us-east-1").delete_table(TableName=url.split("://", 1)[1].split("?", 1)[0])
    out["goals"] = [goal.__dict__ for goal in goals_of(out)]
    return out


FLOWS = (
    ("happy_path", "happy path, gate off"),
    ("happy_path_gated", "happy path, warm gate on"),
    ("one_retry", "one retry per step, gate off"),
)


def goals_of(r: dict[str, Any]) -> list[Goal]:
    happy, gated, rec = r["happy_path"], r["happy_path_gated"], r["reconcile"]
    goals = [
        Goal(
            "state transitions a step, gate off / on (the larger)",
            max(happy["state_transitions_per_step"], gated["state_transitions_per_step"]),
            3,
            timed=False,
        )
    ]
    for key, label in FLOWS[:2]:
        goals += [
            Goal(f"write units a step, {label}, the store's count", r[key]["write_units_per_step"], WRITE_GOAL, timed=False),
            Goal(f"write units a step, {label}, metered", r[key]["metered_write_units_per_step"], WRITE_GOAL, timed=False),
        ]
    unmetered = r["happy_path_gated_unmetered"]["write_units_per_step"]
    goals.append(
        Goal("write units a step, happy path, warm gate on, no meter, the store's count", unmetered, WRITE_GOAL, timed=False)
    )
    for key, label in FLOWS[:2]:
        gap = abs(r[key]["write_units_per_step"] - r[key]["metered_write_units_per_step"])
        goals.append(Goal(f"the two counts apart, {label} (WCU a step)", round(gap, 2), AGREEMENT, timed=False))
    if len(rec) == 2:
        growth = rec[1]["reconcile_read_units"] - rec[0]["reconcile_read_units"]
        goals.append(
            Goal("reconcile's read units over 10x the finished runs, less those over 1x", round(growth, 1), 0, timed=False)
        )
    return goals


def breakdown(flow: dict[str, Any]) -> list[str]:
    """Where a flow's write units go: by store operation (the store's count of it on its
    first row), request (a transaction's action) and item kind, per step."""
    lines = [
        "| operation | request | item | writes / step | table WCU / step | index WCU / step | metered WCU / step | the store's WCU / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    store = flow["write_units_by_operation_per_step"]
    seen: set[str] = set()
    for row in flow["metered_by_operation_per_step"]:
        op = row["operation"]
        own = "" if op in seen else str(store.get(op, 0))
        seen.add(op)
        refused = f" ({row['refused']} refused)" if row["refused"] else ""
        lines.append(
            f"| `{op}` | {row['request']} | {row['item']} | {row['writes']}{refused} | {row['table']} | {row['index']} "
            f"| {row['units']} | {own} |"
        )
    lines.append(f"| all | | | | | | {flow['metered_write_units_per_step']} | {flow['write_units_per_step']} |")
    return lines


def markdown(r: dict[str, Any]) -> str:
    goals = [Goal(**g) for g in r["goals"]]
    lines = [
        "## store_cost — Step Functions transitions and DynamoDB units per step; reconcile's reads",
        "",
        f"Machine: {r['machine']}. Command: `python bench/store_cost.py --write` (DynamoDB and Step Functions under moto;",
        "write units counted twice: by the store from the sizes it writes, and metered on its client from the items before and",
        "after each write request, by DynamoDB's item-size rules (laneflow_dev/capacity.py); read units by the store).",
        "",
        f"| flow ({r['happy_path']['steps']} steps, one fan-out) | state transitions / step | history events / step "
        "| write units / step, the store's | write units / step, metered | read units / step | attempts |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in (*FLOWS, ("happy_path_gated_unmetered", "happy path, warm gate on, no meter on the client")):
        f = r[key]
        lines.append(
            f"| {label} | {f['state_transitions_per_step']} | {f['history_events_per_step']} | {f['write_units_per_step']} "
            f"| {f['metered_write_units_per_step'] or '—'} | {f['read_units_per_step']} | {f['attempts']} |"
        )
    for key, label in FLOWS:
        f = r[key]
        lines += [
            "",
            f"Where the write units go, {label} (creating the run, not counted above: {f['create_run_write_units']} WCU "
            f"by the store, {f['create_run_metered_write_units']} metered"
            + (f"; {f['siblings_keeping_a_token']} of {f['steps'] - 1} siblings kept a token" if f["gate"] else "")
            + "):",
            "",
            *breakdown(f),
        ]
    unmetered = r["happy_path_gated_unmetered"]
    lines += [
        "",
        "The warm gate on again with no meter on the store's client, by the store's count (how many siblings arrive"
        " before their lead's reply, and so keep a token, is a race, decided differently from run to run): "
        + ", ".join(f"`{op}` {w}" for op, w in unmetered["write_units_by_operation_per_step"].items())
        + ".",
        "",
    ]
    lines += ["| finished runs | active runs | reconcile read units | reconcile write units |", "|---|---|---|---|"]
    for rec in r["reconcile"]:
        lines.append(
            f"| {rec['finished_runs']:,} | {rec['active_runs']} | {rec['reconcile_read_units']} | {rec['reconcile_write_units']} |"
        )
    lines += ["", goal_table(goals).rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--finished", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    result = run_bench(args.steps, args.finished)
    if args.write:
        write_section(HERE / "RESULTS.md", "store_cost", markdown(result))
    print(json.dumps(result) if args.json else markdown(result))
    return exit_code([Goal(**g) for g in result["goals"]])


if __name__ == "__main__":
    sys.exit(main())
