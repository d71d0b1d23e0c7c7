"""The records say what the prompt cache did: the run's `lanes` rows (cold prefixes, cache
read and write, gate waits) and each step's `cache_break`, on both stores, through the real
definition on the stub model (whose pretend cache keeps the real rules)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, ServicesOn, drive

from laneflow.domain.records import Run, RunStatus, Step
from laneflow.ports import Services


def _gate_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "ws_gate", tmp_path / "ws_gate"))


def test_a_gated_fan_out_pays_one_cold_prefix_and_its_lane_row_says_so(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run = drive(svc, _gate_copy(tmp_path), "fanout")
    assert run.status == RunStatus.completed
    record = svc.store.get_run(run.tenant, run.id, detail=True).public()
    [row] = record["lanes"]
    written = [s["calls"][0]["tokens"]["cache_write"] for s in record["steps"]]
    read = [s["calls"][0]["tokens"]["cache_read"] for s in record["steps"]]
    assert row["group"] == 0 and row["cycle"] == 0 and row["lane"] == "quick@stub" and row["steps"] == 4
    assert row["cold_prefixes"] == 1 and written[0] > 0 and written[1:] == [0, 0, 0]
    assert read[0] == 0 and read[1:] == [written[0]] * 3
    assert row["cache_write"] == written[0] and row["cache_read"] == 3 * written[0]
    assert row["gate_wait_ms"] >= 3 * 200  # three siblings waited for the lead's 250 ms first token
    assert all(s["cache_break"] is None for s in record["steps"])
    assert record["steps"][0]["prefix"]["tokens"] == written[0]


def test_without_the_gate_every_sibling_writes_and_each_names_the_lead_it_did_not_read(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run = drive(svc, _gate_copy(tmp_path), "fanout", options={"gate": False})
    record = svc.store.get_run(run.tenant, run.id, detail=True).public()
    [row] = record["lanes"]
    assert row["cold_prefixes"] == 4 and row["gate_wait_ms"] == 0
    breaks = [s["cache_break"] for s in record["steps"]]
    # Started together, each wrote the same prefix: nothing differs, the others' writes had not begun.
    assert sum(1 for b in breaks if b is None) >= 1
    for b in breaks:
        if b is not None:
            assert b["layer"] == "expired" and b["since"].startswith(f"{run.id}/")


def test_a_step_that_writes_reads_only_its_agents_started_steps_never_the_whole_run_in_full(
    on: ServicesOn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step that writes its prefix works out its cache_break from the steps of its agent
    that had started (a light read) and, one by one from the nearest, the full records of
    those it needs: a fan-out without the gate, whose first wave all write, read the whole
    run in full once per writer."""
    svc = on()
    whole: list[str] = []
    full_steps: list[int] = []
    get_run, get_step = svc.store.get_run, svc.store.get_step

    def run_read(tenant: str, run_id: str, **kwargs: Any) -> Run:
        if kwargs.get("detail"):
            whole.append(run_id)
        return get_run(tenant, run_id, **kwargs)

    def step_read(tenant: str, run_id: str, index: int, **kwargs: Any) -> Step:
        if kwargs.get("detail"):
            full_steps.append(index)
        return get_step(tenant, run_id, index, **kwargs)

    monkeypatch.setattr(svc.store, "get_run", run_read)
    monkeypatch.setattr(svc.store, "get_step", step_read)
    run = drive(svc, _gate_copy(tmp_path), "fanout", options={"gate": False})
    monkeypatch.undo()
    record = svc.store.get_run(run.tenant, run.id, detail=True).public()
    writers = [s for s in record["steps"] if s["calls"][0]["tokens"]["cache_write"] > 0]
    assert len(writers) == 4 and whole == []  # four wrote; the run itself was never read in full
    named = [s["cache_break"]["since"] for s in writers if s["cache_break"]]
    assert len(named) == 3 and len(full_steps) <= 2 * len(writers)  # each looked at its nearest


def test_a_changed_layer_in_the_next_run_is_named_with_the_step_it_differs_from(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    ws = _gate_copy(tmp_path)
    first = drive(svc, ws, "lone")
    agent = ws / "agents" / "quick" / "agent.md"
    agent.write_text(agent.read_text() + "Also be brief.\n")  # the persona changes
    second = drive(svc, ws, "lone")
    [step, other] = svc.store.get_run(second.tenant, second.id, detail=True).steps
    [before, _] = svc.store.get_run(first.tenant, first.id, detail=True).steps
    assert other.cache_break == {"layer": "expired", "since": f"{first.id}/1"}  # its agent did not change
    assert step.agent == "quick" and step.cache_break == {"layer": "persona", "since": f"{first.id}/{before.index}"}
    third = drive(svc, ws, "lone")  # nothing changed: the stub's cache lasts one run
    [again, _] = svc.store.get_run(third.tenant, third.id, detail=True).steps
    assert again.cache_break == {"layer": "expired", "since": f"{second.id}/{step.index}"}


def test_show_prints_lanes_durations_gate_waits_cache_breaks_and_events_and_follow_waits_for_the_end(
    svc: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    from laneflow.entrypoints.cli import main
    from laneflow.usecases.start_run import create_run
    from laneflow.wiring import local_engine

    ws = _gate_copy(tmp_path)
    drive(svc, ws, "fanout")
    (ws / "agents" / "quick" / "agent.md").write_text((ws / "agents" / "quick" / "agent.md").read_text() + "More.\n")
    run = create_run(svc, ws, "fanout")
    driving = threading.Thread(target=lambda: local_engine(svc).drive(run.tenant, run.id, tick_s=0.02))
    driving.start()
    try:
        assert main(["show", run.id, "--follow", "--store", svc.store.url]) == 0
    finally:
        driving.join(60)
    followed = capsys.readouterr().out
    assert "following; Ctrl-C to stop following" in followed and f"{run.id}: completed" in followed.splitlines()[-1]
    assert "gate: prompt cache: waiting for the first quick step's reply" in followed
    assert main(["show", run.id, "--store", svc.store.url]) == 0
    shown = capsys.readouterr().out
    assert "COLD  CACHE READ  CACHE WRITE  GATE WAIT" in shown and "quick@stub" in shown
    assert "gate wait: " in shown and "events:" in shown and "call 1: " in shown
    assert "cache break: persona changed since run-" in shown  # the lead: the persona changed since the last fanout run
    assert main(["show", run.id, "--follow", "--json", "--store", svc.store.url]) == 0
    assert json.loads(capsys.readouterr().out)["lanes"][0]["cold_prefixes"] == 1


def test_the_apis_run_json_carries_the_lanes_and_each_steps_cache_break(svc: Services, tmp_path: Path) -> None:
    from api_calls import call

    ws = _gate_copy(tmp_path)
    run = drive(svc, ws, "fanout", tenant="acme", options={"gate": False})
    status, record, _ = call(svc, "GET", f"/runs/{run.id}")
    assert status == 200
    assert record["lanes"][0]["lane"] == "quick@stub" and record["lanes"][0]["cold_prefixes"] == 4
    assert all("cache_break" in s and "prefix" in s for s in record["steps"])
    assert any(
        s["cache_break"] == {"layer": "expired", "since": f"{run.id}/{s2['index']}"}
        for s in record["steps"]
        for s2 in record["steps"]
        if s2 is not s
    )
