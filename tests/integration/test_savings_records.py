"""Savings in every record: a group's settlement and the run's end sum the steps' savings
into the run's `savings_usd` (both stores); a Claude fan-out's record (through the Messages
API imitation) carries its lane's `savings_usd` and `gate_savings_usd`, and `show` (text and
--json) and the API's `GET /runs/{id}` show them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_calls import call
from helpers import FIXTURES, ServicesOn
from pydantic import SecretStr

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.messages import DriveRef, EndRunRequest, SettleGroupRequest
from laneflow.domain.pricing import CATALOG
from laneflow.domain.records import Run, RunChanges, RunStatus, StepChanges, StepStatus, finished_event
from laneflow.domain.savings import calls_savings_usd
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.end_run import end_run
from laneflow.usecases.settle_group import settle_group
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

KEY = "sk-test-0123456789abcdef"
LANE = "analyst@claude-sonnet-4-6"


def test_the_groups_settlement_and_the_runs_end_sum_the_steps_savings(on: ServicesOn) -> None:
    svc = on()
    run = create_run(svc, FIXTURES / "ws_gate", "fanout")
    t, r = run.tenant, run.id
    svc.store.update_run(t, r, RunChanges(status=RunStatus.running))
    savings = [0.0135, -0.00375, 0.01725, 0.0]  # a reader, a write-only lead, a reader, the stub
    for step, saved in zip(run.steps, savings, strict=True):
        svc.store.update_step(t, r, step.index, StepChanges(status=StepStatus.completed, cost_usd=0.01, savings_usd=saved))

    settle_group(svc, SettleGroupRequest(run=DriveRef(tenant=t, run_id=r), group=0))
    settled = svc.store.get_run(t, r, steps=False)
    assert settled.savings_usd == round(sum(savings), 6) and settled.cost_usd == 0.04

    # A step's savings changed after the settlement (its attempt ended later): the end settles them again.
    svc.store.update_step(t, r, run.steps[3].index, StepChanges(savings_usd=0.002))
    assert end_run(svc, EndRunRequest(run=DriveRef(tenant=t, run_id=r))).status == RunStatus.completed
    ended = svc.store.get_run(t, r, steps=False)
    assert ended.savings_usd == round(sum(savings[:3]) + 0.002, 6)
    assert finished_event(ended)["savings_usd"] == ended.savings_usd


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=150, api_keys={KEY}) as server:
        yield server


def claude_fanout(tmp_path: Path, api: MessagesImitation) -> tuple[Services, Run, str]:
    """The Claude fan-out driven against the imitation, then each step's savings set from
    its spans as its attempt's end sets them, and the run's as its end settles them."""
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    url = f"sqlite:///{tmp_path / 'savings.db'}"
    settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
    svc = for_store(open_store(url), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
    created = create_run(svc, ws, "fanout")
    run = local_engine(svc).drive(created.tenant, created.id, tick_s=0.02).run
    assert run.status == RunStatus.completed, run.error
    for step in run.steps:
        svc.store.update_step(run.tenant, run.id, step.index, StepChanges(savings_usd=calls_savings_usd(step.calls, step.model)))
    total = round(sum(calls_savings_usd(s.calls, s.model) for s in run.steps), 6)
    svc.store.update_run(run.tenant, run.id, RunChanges(savings_usd=total))
    return svc, svc.store.get_run(run.tenant, run.id), url


def test_a_claude_fan_outs_record_show_and_api_carry_its_steps_lanes_and_gates_savings(
    tmp_path: Path, api: MessagesImitation, capsys: pytest.CaptureFixture[str]
) -> None:
    svc, run, url = claude_fanout(tmp_path, api)
    prices = json.loads(CATALOG.read_text(encoding="utf-8"))["models"]["claude-sonnet-4-6"]
    lead, *siblings = run.steps
    written = lead.calls[0].tokens.cache_write
    assert written > 2048 and all(s.calls[0].tokens.cache_read == written for s in siblings)
    # Worked out by hand: each sibling read the lead's prefix instead of writing it again.
    gate = round(len(siblings) * written * (prices["cache_write_5m"] - prices["cache_read"]) / 1_000_000, 6)
    assert lead.savings_usd < 0 < siblings[0].savings_usd  # the lead only wrote; a sibling read

    record = run.public()
    (row,) = record["lanes"]
    assert row["lane"] == LANE and row["gate_savings_usd"] == gate
    assert row["savings_usd"] == round(sum(s.savings_usd for s in run.steps), 6) == record["savings_usd"]
    assert [s["savings_usd"] for s in record["steps"]] == [s.savings_usd for s in run.steps]

    # `show`: the run's savings beside its cost, each step's beside its own, the lane's columns.
    assert main(["show", run.id, "--store", url]) == 0
    text = capsys.readouterr().out
    assert f"cost ${run.cost_usd:.4f}  cache saved ${run.savings_usd:.4f}" in text
    assert f"(cache saved -${abs(lead.savings_usd):.4f})" in text
    assert f"(cache saved ${siblings[0].savings_usd:.4f})" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[-3:] == ["SAVED", "GATE", "SAVED"])
    assert lines[header + 1].split()[-2:] == [f"${row['savings_usd']:.4f}", f"${gate:.4f}"]  # the lane's row
    assert main(["show", run.id, "--store", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["savings_usd"] == run.savings_usd and shown["lanes"][0]["gate_savings_usd"] == gate

    # The API's run record: the same fields.
    status, payload, _ = call(svc, "GET", f"/runs/{run.id}", tenant=run.tenant)
    assert status == 200, payload
    assert payload["savings_usd"] == run.savings_usd and payload["savings_usd"] != 0
    assert payload["lanes"][0]["savings_usd"] == row["savings_usd"] and payload["lanes"][0]["gate_savings_usd"] == gate
    assert [s["savings_usd"] for s in payload["steps"]] == [s.savings_usd for s in run.steps]
