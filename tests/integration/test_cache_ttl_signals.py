"""The run-level signals of the prompt-cache TTL choice, worked out as a run starts and kept in
`run.options["cache_ttl"]`, on both stores: a lane's later waves and a loop's cycle from the
flow's previous run, an approval between two uses of an agent, the gap between the flow's
starts; and what `auto` then chooses for a step."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, drive, write_workspace

from laneflow.domain.cache_ttl import CACHE_TTL_OPTION, choose_for
from laneflow.domain.records import Run, StepStatus
from laneflow.ports import Services
from laneflow.usecases.start_run import prepare_run

MIN = 60.0

AGENTS: dict[str, dict[str, Any]] = {name: {"model": "stub"} for name in ("researcher", "writer", "checker", "publisher")}

FLOWS: dict[str, dict[str, Any]] = {
    "fanout": {
        "input": {"type": "object", "required": ["topics"]},
        "steps": [
            {"agent": "researcher", "each": "input.topics", "parallel": 2, "instruction": "Research {item}."},
            {"agent": "writer", "instruction": "Write."},
        ],
    },
    "review": {
        "steps": [
            {"agent": "writer", "instruction": "Write."},
            {"agent": "checker", "instruction": "Check.", "until": "APPROVED", "loop": "writer"},
            {"agent": "publisher", "instruction": "Publish."},
        ]
    },
    "approve": {
        "steps": [
            {"agent": "writer", "instruction": "Draft."},
            {"approval": "Go on?"},
            {"agent": "writer", "instruction": "Finish."},
            {"agent": "publisher", "instruction": "Publish."},
        ]
    },
    "approve_in_loop": {
        "steps": [
            {"agent": "writer", "instruction": "Draft."},
            {"approval": "Looks right?"},
            {"agent": "checker", "instruction": "Check.", "until": "APPROVED", "loop": "writer"},
        ]
    },
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return write_workspace(tmp_path / "ws", AGENTS, FLOWS)


def iso(at: _dt.datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ago(minutes: float) -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=minutes)


def earlier_run(
    svc: Services, ws: Path, flow: str, run_input: Any, *, started_min_ago: float, took_min: dict[int, tuple[float, float]]
) -> Run:
    """A run of `flow` as if started `started_min_ago`, its steps `took_min` {index: (start,
    end) in minutes after its start} completed, stored."""
    run = prepare_run(svc, ws, flow, run_input)
    start = ago(started_min_ago)
    run.created_at = iso(start)
    for step in run.steps:
        if step.index in took_min:
            begin, end = took_min[step.index]
            step.status = StepStatus.completed
            step.started_at = iso(start + _dt.timedelta(minutes=begin))
            step.finished_at = iso(start + _dt.timedelta(minutes=end))
    run.status = run.status.completed
    svc.store.create_run(run)
    return run


def signals(svc: Services, ws: Path, flow: str, run_input: Any = None) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = prepare_run(svc, ws, flow, run_input).options[CACHE_TTL_OPTION]
    return found


TOPICS = {"topics": ["tides", "reefs", "kelp", "gulls", "dunes"]}


def test_a_lane_wider_than_its_parallel_expects_its_next_wave_a_previous_step_later(on: ServicesOn, ws: Path) -> None:
    svc = on()
    # Given the flow's previous run, whose researcher steps took 5, 6 and 7 minutes
    earlier_run(svc, ws, "fanout", {"topics": ["a", "b", "c"]}, started_min_ago=90, took_min={0: (0, 5), 1: (0, 6), 2: (5, 12)})
    # When a run of five topics two at a time starts
    found = signals(svc, ws, "fanout", TOPICS)
    # Then its researcher lane expects its next wave a median step later; the writer has no waves
    assert found["researcher"]["later_wave_s"] == pytest.approx(6 * MIN)
    assert found["writer"]["later_wave_s"] is None
    assert choose_for({CACHE_TTL_OPTION: found}, "researcher", "stub")[0] == "1h"
    # And a run of two topics, all in one wave, expects none
    assert signals(svc, ws, "fanout", {"topics": ["x", "y"]})["researcher"]["later_wave_s"] is None


def test_a_lane_wider_than_its_parallel_without_a_previous_run_does_not_know_its_waves(on: ServicesOn, ws: Path) -> None:
    svc = on()
    found = signals(svc, ws, "fanout", TOPICS)
    assert found["researcher"] == {
        "setting": "auto",
        "where": None,
        "later_wave_s": None,
        "loop_cycle_s": None,
        "parks_for_approval": False,
        "flow_start_gap_s": None,
    }
    assert choose_for({CACHE_TTL_OPTION: found}, "researcher", "stub") == ("5m", "auto: no read expected after 5 minutes")


def test_an_agent_in_a_loop_expects_the_previous_runs_last_cycle(on: ServicesOn, ws: Path) -> None:
    svc = on()
    # Given the previous run's last cycle: the writer from minute 10 to 13, the checker to 15
    earlier_run(svc, ws, "review", None, started_min_ago=100, took_min={0: (10, 13), 1: (13, 15), 2: (15, 16)})
    found = signals(svc, ws, "review")
    assert found["writer"]["loop_cycle_s"] == pytest.approx(5 * MIN)
    assert found["checker"]["loop_cycle_s"] == pytest.approx(5 * MIN)
    assert found["publisher"]["loop_cycle_s"] is None  # after the loop
    ttl, reason = choose_for({CACHE_TTL_OPTION: found}, "writer", "claude-sonnet-4-6")
    assert ttl == "1h" and "the loop's last cycle took 5.0 min" in reason


def test_an_approval_between_two_uses_of_an_agent_parks_it(on: ServicesOn, ws: Path) -> None:
    svc = on()
    found = signals(svc, ws, "approve")
    assert found["writer"]["parks_for_approval"] is True
    assert found["publisher"]["parks_for_approval"] is False  # used once, after the approval
    assert choose_for({CACHE_TTL_OPTION: found}, "writer", "stub")[0] == "1h"
    assert choose_for({CACHE_TTL_OPTION: found}, "publisher", "stub")[0] == "5m"
    looped = signals(svc, ws, "approve_in_loop")
    assert looped["writer"]["parks_for_approval"] is True  # the loop comes back to it past the approval
    assert looped["checker"]["parks_for_approval"] is True
    assert signals(svc, ws, "review")["writer"]["parks_for_approval"] is False  # no approval at all


def test_the_start_gap_is_from_the_flows_latest_earlier_run_in_its_tenant_and_workspace(on: ServicesOn, ws: Path) -> None:
    svc = on()
    earlier_run(svc, ws, "review", None, started_min_ago=50, took_min={})
    earlier_run(svc, ws, "review", None, started_min_ago=20, took_min={})
    earlier_run(svc, ws, "approve", None, started_min_ago=2, took_min={})  # another flow
    found = signals(svc, ws, "review")
    for agent in ("writer", "checker", "publisher"):
        assert found[agent]["flow_start_gap_s"] == pytest.approx(20 * MIN, abs=30)
    assert choose_for({CACHE_TTL_OPTION: found}, "writer", "stub")[0] == "1h"
    assert signals(svc, ws, "fanout", TOPICS)["writer"]["flow_start_gap_s"] is None  # never run before


def test_flow_starts_3_minutes_or_2_hours_apart_write_for_5_minutes(on: ServicesOn, ws: Path) -> None:
    svc = on()
    earlier_run(svc, ws, "review", None, started_min_ago=120, took_min={})
    found = signals(svc, ws, "review")
    assert found["writer"]["flow_start_gap_s"] == pytest.approx(120 * MIN, abs=30)
    assert choose_for({CACHE_TTL_OPTION: found}, "writer", "stub")[0] == "5m"
    earlier_run(svc, ws, "review", None, started_min_ago=3, took_min={})
    found = signals(svc, ws, "review")
    assert found["writer"]["flow_start_gap_s"] == pytest.approx(3 * MIN, abs=30)
    assert choose_for({CACHE_TTL_OPTION: found}, "writer", "stub")[0] == "5m"


def test_durations_count_on_the_cache_clock(on: ServicesOn, ws: Path) -> None:
    # A benchmark's clock 60 times as fast: runs 20 s apart are 20 cache minutes apart.
    svc = on(LANEFLOW_CACHE_CLOCK="60@1767225600")
    assert svc.settings.cache_clock == "60@1767225600"
    earlier_run(svc, ws, "review", None, started_min_ago=20 / 60, took_min={0: (0, 0.05), 1: (0.05, 0.1)})
    found = signals(svc, ws, "review")
    assert found["writer"]["flow_start_gap_s"] == pytest.approx(20 * MIN, abs=60)
    assert found["writer"]["loop_cycle_s"] == pytest.approx(6 * MIN)


def test_the_setting_and_the_file_that_set_it_are_recorded(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    agents = {**AGENTS, "writer": {"model": "stub", "cache_ttl": "5m"}}
    root = write_workspace(tmp_path / "ws", agents, FLOWS, agents_md="model: stub\ncache_ttl: 1h\n")
    found = signals(svc, root, "approve")
    assert (found["writer"]["setting"], found["writer"]["where"]) == ("5m", "agents/writer/agent.md")
    assert (found["publisher"]["setting"], found["publisher"]["where"]) == ("1h", "AGENTS.md")
    # Explicit settings are taken as they are, whatever the signals say
    assert choose_for({CACHE_TTL_OPTION: found}, "writer", "stub") == ("5m", "cache_ttl: 5m in agents/writer/agent.md")
    assert choose_for({CACHE_TTL_OPTION: found}, "publisher", "stub") == ("1h", "cache_ttl: 1h in AGENTS.md")


def test_no_agent_on_auto_reads_no_other_run(on: ServicesOn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = on()
    root = write_workspace(tmp_path / "ws", AGENTS, FLOWS, agents_md="model: stub\ncache_ttl: 5m\n")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read the store's runs")

    monkeypatch.setattr(svc.store, "list_runs", refuse)
    assert {a["setting"] for a in signals(svc, root, "review").values()} == {"5m"}


def test_a_store_that_cannot_be_read_leaves_the_signals_unknown_and_the_run_starts(
    on: ServicesOn, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = on()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the store is away")

    monkeypatch.setattr(svc.store, "list_runs", broken)
    found = signals(svc, ws, "approve")
    assert found["writer"]["flow_start_gap_s"] is None
    assert found["writer"]["parks_for_approval"] is True  # read from the flow alone


def test_a_driven_run_gives_the_next_its_steps_median_and_its_start(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    agents = {"researcher": {"model": "stub", "stub": "delay_ms: 150\nfound it.\n"}, "writer": {"model": "stub"}}
    root = write_workspace(tmp_path / "ws", agents, {"fanout": FLOWS["fanout"]})
    first = drive(svc, root, "fanout", TOPICS)
    assert first.status == "completed"
    found = signals(svc, root, "fanout", TOPICS)
    assert found["researcher"]["later_wave_s"] is not None and 0.15 <= found["researcher"]["later_wave_s"] < 60
    assert found["researcher"]["flow_start_gap_s"] is not None and found["researcher"]["flow_start_gap_s"] > 0
    stored = svc.store.get_run(first.tenant, first.id, steps=False).options[CACHE_TTL_OPTION]
    assert stored["researcher"]["setting"] == "auto" and stored["researcher"]["flow_start_gap_s"] is None
