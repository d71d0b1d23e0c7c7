"""Benchmark: what a step costs the cloud services, and what reconcile reads.

1. A 100-step stub flow (one fan-out, warm gate on) driven through the real definition on the
   DynamoDB store (moto), once on the happy path and once with one retry per step:
   Step Functions state transitions per step (states entered, from the execution history)
   and DynamoDB write and read capacity units per step (counted by the store from item
   sizes: 1 WCU per KB written, 4 KB per RCU, transactions and index writes included).
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

from benchlib import machine, write_section

from laneflow.wiring import for_store, local_engine

if TYPE_CHECKING:
    from laneflow.adapters.engine.local import LocalEngine
    from laneflow.adapters.store.dynamodb import DynamoStore
    from laneflow.ports import Services

HERE = Path(__file__).resolve().parent
URL = "dynamodb://laneflow-bench?bucket=laneflow-bench-blobs&region=us-east-1"


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


def drive_flow(svc: Services, engine: LocalEngine, ws: Path, flow: str, steps: int, gate: bool = True) -> dict[str, Any]:
    from laneflow.usecases.start_run import create_run

    store = cast("DynamoStore", svc.store)  # the benchmark's store is DynamoDB's (its consumed capacity)
    store.consumed(reset=True)
    run = create_run(svc, ws, flow, {"items": [f"item-{i}" for i in range(steps)]}, options={"gate": gate})
    created = store.consumed(reset=True)
    result = engine.drive(run.tenant, run.id)
    used = store.consumed(reset=True)
    history = engine.history(result.execution_arn)
    entered = sum(1 for e in history if e["type"].endswith("StateEntered"))
    writes = sum(used.get("write", {}).values())
    reads = sum(used.get("read", {}).values())
    per_op = {op: round(w / steps, 2) for op, w in sorted(used.get("write", {}).items()) if w}
    return {
        "flow": flow,
        "gate": gate,
        "steps": steps,
        "status": str(result.run.status),
        "error": result.run.error,
        "attempts": sum(s.attempts for s in result.run.steps),
        "state_transitions_per_step": round(entered / steps, 2),
        "history_events_per_step": round(len(history) / steps, 2),
        "write_units_per_step": round(writes / steps, 2),
        "read_units_per_step": round(reads / steps, 2),
        "write_units_by_operation_per_step": per_op,
        "create_run_write_units": round(sum(created.get("write", {}).values()), 1),
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
    from laneflow_dev.moto_support import serialized_dynamodb

    out: dict[str, Any] = {"benchmark": "store_cost", "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp, mock_aws(), serialized_dynamodb():
        ws = make_workspace(Path(tmp))
        init_store(URL)
        svc = for_store(open_store(URL), Settings(store_url=URL, capture_dir=str(Path(tmp) / "captures")))
        engine = local_engine(svc)
        drive_flow(svc, engine, ws, "worker", 2)  # warm-up
        out["happy_path"] = drive_flow(svc, engine, ws, "worker", steps, gate=False)
        out["happy_path_gated"] = drive_flow(svc, engine, ws, "worker", steps, gate=True)
        out["one_retry"] = drive_flow(svc, engine, ws, "flaky", steps, gate=False)
        out["reconcile"] = []
        for finished_runs in (finished // 10, finished):
            url = URL.replace("laneflow-bench", f"laneflow-rec-{finished_runs}")
            init_store(url)
            out["reconcile"].append(reconcile_reads(url, finished_runs, 100))
            # Gone before the next: every transaction reconcile writes copies each table it names.
            boto3.client("dynamodb", region_name="us-east-1").delete_table(TableName=url.split("://", 1)[1].split("?", 1)[0])
    happy = out["happy_path"]
    rec = out["reconcile"]
    out["goals"] = {
        "at_most_3_transitions_per_step": happy["state_transitions_per_step"] <= 3
        and out["happy_path_gated"]["state_transitions_per_step"] <= 3,
        "at_most_6_write_units_per_step_gate_off": happy["write_units_per_step"] <= 6,
        "at_most_6_write_units_per_step_warm_gate_on": out["happy_path_gated"]["write_units_per_step"] <= 6,
        "reconcile_reads_grow_with_active_runs_not_all": len(rec) == 2
        and rec[0]["reconcile_read_units"] == rec[1]["reconcile_read_units"],
    }
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "## store_cost — Step Functions transitions and DynamoDB units per step; reconcile's reads",
        "",
        f"Machine: {r['machine']}. Command: `python bench/store_cost.py --write` (DynamoDB and Step Functions under moto;",
        "capacity units counted by the store from item sizes: 1 WCU per KB written, 1 RCU per 4 KB read, transactions 2x, index writes included).",
        "",
        f"| flow ({r['happy_path']['steps']} steps, one fan-out) | state transitions / step | history events / step | write units / step | read units / step | attempts |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (
        ("happy_path", "happy path, gate off"),
        ("happy_path_gated", "happy path, warm gate on"),
        ("one_retry", "one retry per step, gate off"),
    ):
        f = r[key]
        lines.append(
            f"| {label} | {f['state_transitions_per_step']} | {f['history_events_per_step']} | {f['write_units_per_step']} "
            f"| {f['read_units_per_step']} | {f['attempts']} |"
        )
    for key, label in (("happy_path", "gate off"), ("happy_path_gated", "warm gate on")):
        lines += [
            "",
            f"Write units per step by store operation, happy path, {label}: "
            + ", ".join(f"`{op}` {w}" for op, w in r[key]["write_units_by_operation_per_step"].items())
            + f"; creating the run: {r[key]['create_run_write_units']} WCU.",
        ]
    lines.append("")
    lines += ["| finished runs | active runs | reconcile read units | reconcile write units |", "|---|---|---|---|"]
    for rec in r["reconcile"]:
        lines.append(
            f"| {rec['finished_runs']:,} | {rec['active_runs']} | {rec['reconcile_read_units']} | {rec['reconcile_write_units']} |"
        )
    lines += ["", "| goal | met |", "|---|---|"]
    lines += [f"| {k.replace('_', ' ')} | {'yes' if v else 'NO'} |" for k, v in r["goals"].items()]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
