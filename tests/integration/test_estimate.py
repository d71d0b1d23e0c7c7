"""`laneflow estimate` and `POST /estimates`: the estimate's cache figures equal what a run
then does, on the stub (exactly, cost included) and on Claude's executor through the
Messages API imitation (cost within the error bench/estimate.py measures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLES, FIXTURES, drive
from pydantic import SecretStr

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.records import RunStatus
from laneflow.entrypoints.cli import main
from laneflow.ports import Services
from laneflow.usecases.estimate import estimate_run
from laneflow.wiring import for_store
from laneflow_dev.imitation import MessagesImitation

TOPICS = {"topics": ["tides", "kelp", "reefs"]}

MEASURED_ERROR = 0.01  # bench/RESULTS.md, "estimate": at most 0.8 % learned from the flow's previous run


def _lanes_of(record: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(row["group"], row["lane"]): row for row in record["lanes"]}


def test_on_the_stub_the_estimate_is_what_the_run_then_does(svc: Services, tmp_path: Path) -> None:
    ws = Path(shutil.copytree(EXAMPLES / "newsroom", tmp_path / "newsroom"))
    estimate = estimate_run(svc, ws, "brief", TOPICS).as_dict()
    run = drive(svc, ws, "brief", TOPICS)
    # A stub run teaches a later estimate nothing: the stub's answers are its own output.
    assert estimate_run(svc, ws, "brief", TOPICS).as_dict()["output_learned_from"] is None
    assert run.status == RunStatus.completed
    lanes = _lanes_of(svc.store.get_run(run.tenant, run.id, detail=True).public())
    assert [(lane["group"], lane["lane"]) for lane in estimate["lanes"]] == list(lanes)
    for lane in estimate["lanes"]:
        row = lanes[(lane["group"], lane["lane"])]
        expected = lane["with_gate"]
        assert (expected["cold_prefixes"], expected["cache_write"], expected["cache_read"]) == (
            row["cold_prefixes"],
            row["cache_write"],
            row["cache_read"],
        ), lane["lane"]
    assert estimate["cost_usd"]["expected"] == pytest.approx(run.cost_usd)
    # Without the gate the researchers' first three start together and each writes the prefix.
    [researchers] = [lane for lane in estimate["lanes"] if lane["lane"] == "researcher@stub"]
    assert researchers["without_gate"]["cold_prefixes"] == 3 and researchers["with_gate"]["cold_prefixes"] == 1


@pytest.mark.slow
def test_through_the_imitation_the_cache_figures_equal_the_runs_and_the_cost_is_within_the_measured_error(
    svc: Services, tmp_path: Path
) -> None:
    ws = Path(shutil.copytree(EXAMPLES / "newsroom", tmp_path / "newsroom"))
    with MessagesImitation(ttft_ms=50, api_keys={"sk-test"}) as api:
        cfg = svc.settings.model_copy(update={"anthropic_api_key": SecretStr("sk-test"), "anthropic_base_url": api.url})
        claude = for_store(svc.store, cfg)
        run = drive(claude, ws, "brief", TOPICS, model="claude-sonnet-4-6")
    assert run.status == RunStatus.completed, run.error
    record = svc.store.get_run(run.tenant, run.id, detail=True).public()
    calls = [c for s in record["steps"] for c in s["calls"]]
    per_turn = round(sum(c["tokens"]["output"] for c in calls) / len(calls))
    # As the run found the cache: cold (two hours on, the registry holds nothing warm).
    later = svc.cache_now() + 7200
    estimate = estimate_run(svc, ws, "brief", TOPICS, model="claude-sonnet-4-6", output_tokens=per_turn, now=later).as_dict()
    lanes = _lanes_of(record)
    for lane in estimate["lanes"]:
        row = lanes[(lane["group"], lane["lane"])]
        assert (
            lane["prefix_tokens"]
            == record["steps"][[s["agent"] for s in record["steps"]].index(lane["lane"].split("@")[0])]["prefix"]["tokens"]
        )
        assert (lane["with_gate"]["cold_prefixes"], lane["with_gate"]["cache_write"], lane["with_gate"]["cache_read"]) == (
            row["cold_prefixes"],
            row["cache_write"],
            row["cache_read"],
        ), lane["lane"]
    error = abs(estimate["cost_usd"]["expected"] - record["cost_usd"]) / record["cost_usd"]
    assert error <= MEASURED_ERROR, (estimate["cost_usd"], record["cost_usd"])


def test_estimate_json_is_nothing_but_the_estimate_and_a_typo_in_the_flow_suggests_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    store = f"sqlite:///{tmp_path / 'e.db'}"
    assert main(["estimate", str(EXAMPLES / "newsroom"), "brief", "--input", json.dumps(TOPICS), "--store", store, "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["flow"] == "brief" and data["cost_usd"]["low"] <= data["cost_usd"]["expected"] <= data["cost_usd"]["high"]
    assert main(["estimate", str(EXAMPLES / "newsroom"), "brefi", "--store", store]) == 2
    said = capsys.readouterr().err
    assert "no flow 'brefi' in newsroom" in said and "did you mean 'brief'?" in said
    assert main(["estimate", str(EXAMPLES / "newsroom"), "brief", "--input", json.dumps(TOPICS), "--store", store]) == 0
    table = capsys.readouterr().out
    assert "researcher@stub" in table and "cold prefixes: 4 with the gate, 6 without" in table


def test_post_estimates_answers_the_estimate_and_400s_naming_the_field(svc: Services) -> None:
    from api_calls import call

    svc.workspaces = FolderWorkspaces(FIXTURES)
    status, body, _ = call(svc, "POST", "/estimates", {"workspace": "ws_gate", "flow": "fanout"})
    assert status == 200, body
    [lane] = body["lanes"]
    assert lane["lane"] == "quick@stub" and lane["with_gate"]["cold_prefixes"] == 1 and lane["without_gate"]["cold_prefixes"] == 4
    status, body, _ = call(svc, "POST", "/estimates", {"workspace": "ws_gate"})
    assert status == 400 and "flow" in json.dumps(body)
    status, body, _ = call(svc, "POST", "/estimates", {"workspace": "ws_gate", "flow": "fanout", "output_tokens": -1})
    assert status == 400 and "output_tokens" in json.dumps(body)
    status, body, _ = call(svc, "POST", "/estimates", {"workspace": "ws_gate", "flow": "fanuot"})
    assert status == 400 and "did you mean 'fanout'?" in body["message"]
    assert svc.store.list_runs("acme") == []  # nothing was written


def test_the_openapi_document_describes_the_estimate_and_its_400(svc: Services) -> None:
    from api_calls import call

    status, document, _ = call(svc, "GET", "/openapi.json", tenant=None)
    operation = document["paths"]["/estimates"]["post"]
    assert status == 200 and {"200", "400"} <= set(operation["responses"])
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["$ref"].endswith("/EstimateAnswer")
    assert "output_tokens" in json.dumps(document["components"]["schemas"]["EstimateRequest"])


@pytest.mark.slow
def test_once_the_flow_has_run_the_estimate_learns_its_output_and_is_within_the_error_of_the_next_run(
    svc: Services, tmp_path: Path
) -> None:
    """No --output-tokens: the first estimate assumes the default output (nothing to learn);
    after a run it assumes what each agent's calls wrote in that run, and a later run (whose
    prefixes the registry holds warm, as the estimate finds them) costs what it says, within
    the measured error."""
    ws = Path(shutil.copytree(EXAMPLES / "newsroom", tmp_path / "newsroom"))
    api = MessagesImitation(ttft_ms=50, api_keys={"sk-test"}).start()

    def claude_run() -> Any:
        cfg = svc.settings.model_copy(update={"anthropic_api_key": SecretStr("sk-test"), "anthropic_base_url": api.url})
        return drive(for_store(svc.store, cfg), ws, "brief", TOPICS, model="claude-sonnet-4-6")

    first = estimate_run(svc, ws, "brief", TOPICS, model="claude-sonnet-4-6").as_dict()
    assert first["output_learned_from"] is None
    earlier = claude_run()
    learned = estimate_run(svc, ws, "brief", TOPICS, model="claude-sonnet-4-6").as_dict()
    assert learned["output_learned_from"] == earlier.id
    try:
        later = claude_run()
    finally:
        api.stop()
    assert later.status == RunStatus.completed, later.error
    error = abs(learned["cost_usd"]["expected"] - later.cost_usd) / later.cost_usd
    assert error <= MEASURED_ERROR, (learned["cost_usd"], later.cost_usd)
    # The default assumption (400 tokens a turn) is far off an imitation that replies in a line.
    assert abs(first["cost_usd"]["expected"] - later.cost_usd) / later.cost_usd > MEASURED_ERROR
