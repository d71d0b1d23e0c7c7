"""`laneflow estimate` and the prompt cache across runs: a prefix the registry holds as warm
now is read by its lane's lead (a stale one is written); on a flow that never ran the range
holds what the run then costs; once it has run, the point is within 15 % of the next run.
Claude's executor runs against the Messages API imitation; the store is each of both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import ServicesOn, drive, write_workspace

from laneflow.domain.cache import cache_now
from laneflow.domain.prefixes import TTL_S, WARM_MARGIN_S
from laneflow.domain.records import RunStatus
from laneflow.entrypoints.cli_views import estimate_text
from laneflow.usecases.estimate import estimate_run
from laneflow.usecases.run_step.cache_break import job_prefix_key
from laneflow.usecases.run_step.job import attempt_job
from laneflow.usecases.run_step.runner import prepare
from laneflow.usecases.start_run import create_run
from laneflow_dev.imitation import MessagesImitation

MODEL = "claude-sonnet-4-5"  # caches from 1,024 tokens
KEY = "sk-estimate"
GOAL = 0.15  # a flow that has run: the next run's cost within 15 % of the point

# Over 4,096 characters, so the reader's prefix is above the model's minimum and is cached.
PERSONA = "You read what you are asked to read with care, and say in one line what you found there. " * 50


def _workspace(root: Path) -> Path:
    """A reader fanned out over three items (two at once) that lists a folder before it
    answers (two turns on the imitation), a writer below the minimum cacheable prefix, and
    the reader again in a third group (its prefix was written by the first)."""
    ws = write_workspace(
        root / "ws",
        {
            "reader": {"description": "reads", "tools": ["read_file", "list_files"]},
            "writer": {"description": "writes"},
        },
        {
            "survey": {
                "description": "read, write it up, check",
                "steps": [
                    {
                        "agent": "reader",
                        "each": ["tides", "kelp", "reefs"],
                        "parallel": 2,
                        "instruction": 'Read about {item}.\n[[tool list_files {"path": "."}]]',
                    },
                    {"agent": "writer", "instruction": "Write it up in a line."},
                    {"agent": "reader", "instruction": "Check the write-up."},
                ],
            }
        },
        agents_md=f"model: {MODEL}\n",
    )
    agent_md = ws / "agents" / "reader" / "agent.md"
    agent_md.write_text(agent_md.read_text() + PERSONA + "\n")
    return ws


def _lanes(estimate: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(lane["group"], lane["lane"]): lane for lane in estimate["lanes"]}


READER = (0, f"reader@{MODEL}")


def test_a_prefix_the_registry_holds_as_warm_now_is_read_by_the_lead_and_a_stale_one_is_written(
    on: ServicesOn, tmp_path: Path
) -> None:
    svc = on()
    ws = _workspace(tmp_path)
    cold = _lanes(estimate_run(svc, ws, "survey").as_dict())[READER]
    prefix = cold["prefix_tokens"]
    assert cold["cacheable"] and cold["lead"] == "writes" and cold["lead_reads"] is None
    assert (cold["with_gate"]["cold_prefixes"], cold["with_gate"]["cache_write"]) == (1, prefix)

    # Given a record last written just past its TTL less the margin: stale, the lead writes.
    stale_at = cache_now() - (TTL_S["5m"] - WARM_MARGIN_S) - 5
    svc.store.prefix_began("local", cold["prefix_key"], model=MODEL, run_id="run-long-ago", writer=None, at=stale_at, ttl="5m")
    stale = _lanes(estimate_run(svc, ws, "survey").as_dict())[READER]
    assert stale["lead"] == "writes" and stale["with_gate"] == cold["with_gate"] and stale["warm_now"] is None

    # Given the same prefix written now by another run: its lead reads it too, no cold prefix.
    svc.store.prefix_began("local", cold["prefix_key"], model=MODEL, run_id="run-just-now", writer=None, at=cache_now(), ttl="5m")
    data = estimate_run(svc, ws, "survey").as_dict()
    warm = _lanes(data)[READER]
    assert warm["lead"] == "reads" and warm["lead_reads"] == "warm now (run run-just-now)"
    assert warm["warm_now"]["run"] == "run-just-now" and warm["warm_now"]["until"] > warm["warm_now"]["since"]
    assert (warm["with_gate"]["cold_prefixes"], warm["with_gate"]["cache_write"]) == (0, 0)
    assert warm["with_gate"]["cache_read"] == cold["with_gate"]["cache_read"] + prefix
    assert warm["without_gate"]["cache_write"] == 0  # warm: the siblings read it without the gate too
    assert warm["with_gate"]["cost_usd"] < cold["with_gate"]["cost_usd"]
    assert "G0 reader@claude-sonnet-4-5: warm now (run run-just-now), since" in estimate_text(data)
    # The record is the tenant's: another tenant's run of the same flow writes its own.
    other = _lanes(estimate_run(svc, ws, "survey", tenant="acme").as_dict())[READER]
    assert other["lead"] == "writes" and other["with_gate"]["cold_prefixes"] == 1


def test_the_estimates_prefix_key_is_the_one_the_lanes_steps_register(on: ServicesOn, tmp_path: Path) -> None:
    svc = on(ANTHROPIC_API_KEY=KEY)  # nothing is called: the run is only created
    ws = _workspace(tmp_path)
    estimate = _lanes(estimate_run(svc, ws, "survey").as_dict())
    run = create_run(svc, ws, "survey")
    for step in run.steps:
        prepared = prepare(svc, run, step)  # as the runner prepares an attempt
        try:
            job = attempt_job(svc, run, step, prepared, user="", attempt=1, budget=None, size=None, secret_env={})
        finally:
            prepared.copy.discard()
        assert job_prefix_key(job) == estimate[(step.group, f"{step.agent}@{MODEL}")]["prefix_key"], step.index
    assert estimate[READER]["prefix_key"] == estimate[(2, f"reader@{MODEL}")]["prefix_key"]
    assert estimate[READER]["prefix_key"] != estimate[(1, f"writer@{MODEL}")]["prefix_key"]


def test_on_a_flow_that_never_ran_the_range_holds_what_the_run_then_costs(on: ServicesOn, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    with MessagesImitation(ttft_ms=0, api_keys={KEY}) as api:
        svc = on(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=api.url)
        estimate = estimate_run(svc, ws, "survey").as_dict()
        run = drive(svc, ws, "survey")
    cost = estimate["cost_usd"]
    assert estimate["output_learned_from"] is None
    assert run.status == RunStatus.completed, run.error
    record = svc.store.get_run(run.tenant, run.id, detail=True)
    assert max(len(s.calls) for s in record.steps) == 2  # the readers took a turn more than the low end assumes
    assert 0 < cost["low"] <= run.cost_usd <= cost["high"], (cost, run.cost_usd)
    assert cost["low"] < cost["expected"] < cost["high"]
    # The third group's reader reads what the first group's wrote, as the estimate said.
    third = _lanes(estimate)[(2, f"reader@{MODEL}")]
    assert third["lead_reads"] == "written in group 0 of this run"
    [row] = [lane for lane in record.public()["lanes"] if lane["group"] == 2]
    assert (row["cold_prefixes"], row["cache_write"]) == (0, 0) and row["cache_read"] > 0


def test_once_the_flow_has_run_the_point_is_within_15_percent_of_the_next_runs_cost(on: ServicesOn, tmp_path: Path) -> None:
    """After a run, the estimate takes each entry's turns and output per call from it; the
    next run on the same cache (which the registry holds as warm, as the first run's steps
    recorded it) costs what it says, within the goal."""
    ws = _workspace(tmp_path)
    with MessagesImitation(ttft_ms=0, api_keys={KEY}) as api:
        svc = on(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=api.url)
        first = drive(svc, ws, "survey")
        assert first.status == RunStatus.completed, first.error
        for lane in estimate_run(svc, ws, "survey").as_dict()["lanes"]:
            if lane["cacheable"]:  # what the first run's leads registered at their first event
                svc.store.prefix_began(
                    "local", lane["prefix_key"], model=MODEL, run_id=first.id, writer=None, at=cache_now(), ttl="5m"
                )
        learned = estimate_run(svc, ws, "survey").as_dict()
        second = drive(svc, ws, "survey")
    assert second.status == RunStatus.completed, second.error
    assert learned["output_learned_from"] == first.id
    lanes = _lanes(learned)
    assert lanes[READER]["turns"] == 2 and lanes[(2, f"reader@{MODEL}")]["turns"] == 1  # each entry's own
    assert lanes[READER]["lead_reads"] == f"warm now (run {first.id})"
    error = abs(learned["cost_usd"]["expected"] - second.cost_usd) / second.cost_usd
    assert error <= GOAL, (learned["cost_usd"], second.cost_usd)
    assert learned["cost_usd"]["low"] <= second.cost_usd <= learned["cost_usd"]["high"]
