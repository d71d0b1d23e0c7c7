"""`runs`, `show` and `estimate` on a terminal: they fit its width, down to 60 columns,
without cutting or folding a figure (costs, tokens, counts, times) or a run's id; text
columns fold instead. Piped (no width), every row is one line. And the wording: a run that
has not finished says what it is doing (never `finished None`), counts take their singular."""

from __future__ import annotations

import re
from typing import Any

import pytest

from laneflow.domain.lanes_report import lane_rows
from laneflow.domain.records import Event, EventType, ModelCall, Run, RunStatus, Step, StepStatus, Tokens
from laneflow.entrypoints.cli_tables import Column, fit, wrap
from laneflow.entrypoints.cli_views import asking_column, describe, estimate_text, runs_table, usd
from laneflow.entrypoints.progress import render

WIDTHS = [60, 120]


def whole(figure: str, text: str) -> bool:
    """The figure is in the text as one piece: not the head or the tail of a longer one."""
    return re.search(rf"(?<![\w.,$]){re.escape(figure)}(?!\w|[.,]\d)", text) is not None


def fits(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


def _call(n: int, read: int, write: int, cost: float) -> ModelCall:
    return ModelCall(
        id=f"c{n}",
        n=1,
        ms=1234 + n,
        ttft_ms=321,
        tokens=Tokens(input=1234 + n, output=567, cache_read=read, cache_write=write),
        cost_usd=cost,
    )


def a_run(status: RunStatus = RunStatus.running) -> Run:
    """A fan-out of three researchers (one still running), a writer to come, an approval."""
    steps = [
        Step(
            index=i,
            group=0,
            agent="researcher",
            item=topic,
            model="claude-sonnet-4-6",
            status=StepStatus.completed if i < 2 else StepStatus.running,
            attempts=1,
            started_at=f"2026-12-01T00:00:0{i + 1}.000Z",
            finished_at=f"2026-12-01T00:00:0{i + 4}.250Z" if i < 2 else None,
            cost_usd=cost,
            savings_usd=saved,
            calls=[_call(i, read, write, cost)],
            conclusion=f"Five facts about {topic}.",
            events=[Event(type=EventType.gate, text="prompt cache: lead of its lane", t="2026-12-01T00:00:01.500Z")],
        )
        for i, (topic, cost, saved, read, write) in enumerate(
            [("tides", 0.0215, -0.0031, 0, 12345), ("kelp forests", 0.0072, 0.0104, 12345, 0), ("sea ice", 0.0038, 0.0, 12345, 0)]
        )
    ]
    steps += [
        Step(index=3, group=1, agent="writer", model="claude-sonnet-4-6"),
        Step(index=4, group=2, agent=None, instruction="Publish this brief?"),
    ]
    return Run(
        id="run-20261201-000000-abcdef",
        workspace="newsroom-with-a-long-name",
        flow="brief",
        status=status,
        revision="sha256:" + "0123456789abcdef" * 4,
        created_at="2026-12-01T00:00:00.000Z",
        driven_at="2026-12-01T00:00:00.750Z",
        drives=1,
        cost_usd=0.0325,
        savings_usd=0.0073,
        steps=steps,
    )


def show_figures(run: Run) -> list[str]:
    """Every figure `show` prints of the record, as it prints it."""
    figures = [f"${run.cost_usd:.4f}", usd(run.savings_usd), run.id]
    for s in run.steps:
        figures += [f"${s.cost_usd:.4f}", f"{sum(c.tokens.input + c.tokens.output for c in s.calls):,}"]
        figures += [usd(s.savings_usd)] if s.savings_usd else []
        for c in s.calls:
            figures += [f"{c.ms}", f"{c.ttft_ms}", f"{c.tokens.input}", f"{c.tokens.output}", f"{c.tokens.cache_read}"]
        if s.started_at and s.finished_at:
            figures.append("3.250s")
    for row in lane_rows(run.steps):
        figures += [f"{row['cache_read']:,}", f"{row['cache_write']:,}", usd(row["savings_usd"]), usd(row["gate_savings_usd"])]
    return figures


@pytest.mark.parametrize("width", WIDTHS)
def test_show_fits_the_terminal_and_every_figure_of_the_record_is_whole(width: int) -> None:
    run = a_run()
    text = describe(run, width)
    assert fits(text, width) == []
    missing = [f for f in show_figures(run) if not whole(f, text)]
    assert missing == [], text
    assert "24,690" in text  # the lane's cache reads: two readers of 12,345


def test_show_piped_keeps_every_line_whole_and_the_lanes_one_row_each() -> None:
    run = a_run()
    text = describe(run, None)
    assert "  GROUP  CYCLE  LANE" in text and "COLD  CACHE READ  CACHE WRITE  GATE WAIT" in text
    [row] = [line for line in text.splitlines() if "researcher@claude-sonnet-4-6" in line]
    lane = lane_rows(run.steps)[0]
    assert row.split() == [
        "0",
        "0",
        lane["lane"],
        "3",
        "1",
        "24,690",
        "12,345",
        "0.000s",
        usd(lane["savings_usd"]),
        usd(lane["gate_savings_usd"]),
    ]
    assert "sha256:" + "0123456789abcdef" * 4 in text  # the whole revision when nothing is cut


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_fits_the_terminal_and_no_cost_or_id_is_cut(width: int) -> None:
    runs = [
        a_run(RunStatus.awaiting_approval),
        a_run(RunStatus.completed).model_copy(
            update={"id": "run-20261201-000001-bbbbbb", "cost_usd": 12.5, "drives": 3, "flow": "a-much-longer-flow-name"}
        ),
    ]
    text = runs_table(runs, [asking_column({runs[0].id: [2, 7]})], width)
    assert fits(text, width) == [], text
    for figure in ["$0.0325", "$12.5000", runs[0].id, runs[1].id]:
        assert whole(figure, text), (figure, text)
    header = text.splitlines()[0].split()
    assert header[:2] == ["RUN", "STATUS"] and header[-1] == ("ASKING" if width >= 120 else "ASK")
    assert ("CREATED" in header) == (width >= 120)  # left out where it does not fit: the run's id carries the time


def test_runs_piped_is_one_line_a_run_with_every_column() -> None:
    runs = [a_run(RunStatus.completed)]
    header, row = runs_table(runs, [asking_column({})]).splitlines()
    assert header.split() == ["RUN", "STATUS", "FLOW", "COST", "DRIVES", "CREATED", "ASKING"]
    assert row.split() == [runs[0].id, "completed", "newsroom-with-a-long-name/brief", "$0.0325", "1", runs[0].created_at]


def an_estimate() -> dict[str, Any]:
    lane = {
        "group": 0,
        "lane": "researcher@claude-sonnet-4-6",
        "steps": 12,
        "prefix_tokens": 12345,
        "cacheable": True,
        "lead": "writes",
        "lead_reads": None,
        "warm_now": None,
        "with_gate": {"cache_write": 12345, "cache_read": 135795, "cost_usd": 0.0215},
        "without_gate": {"cache_write": 148140, "cache_read": 0, "cost_usd": 5.5554},
    }
    return {
        "workspace": "newsroom",
        "flow": "brief",
        "lanes": [lane, {**lane, "group": 1, "lane": "writer@claude-sonnet-4-6", "steps": 1, "cacheable": False}],
        "totals": {"with_gate": {"cold_prefixes": 1}, "without_gate": {"cold_prefixes": 12}},
        "cost_usd": {"expected": 0.0215, "without_gate": 5.5554, "low": 0.0049, "high": 7.3868},
        "range_rule": "low: one turn a step; high: max_turns turns",
        "output_learned_from": None,
        "output_tokens_per_turn": 400,
        "unpriced_models": [],
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_estimate_fits_the_terminal_and_no_figure_is_cut(width: int) -> None:
    text = estimate_text(an_estimate(), width)
    assert fits(text, width) == [], text
    for figure in ["12,345", "12,345/135,795", "148,140/0", "$0.0215", "$5.5554", "$0.0049", "$7.3868", "12"]:
        assert whole(figure, text), (figure, text)
    assert "12,345*" in text  # below the minimum: marked, not cut


def test_a_table_too_wide_for_the_terminal_is_drawn_wider_rather_than_cut_a_figure() -> None:
    figures = ["$1,234.5678", "12,345,678", "0.123s", "987,654"]

    def nth(i: int) -> Column:
        return Column(f"FIGURE {i}", lambda row: str(row[1][i]), right=True)

    columns = [Column("NAME", lambda row: str(row[0])), *(nth(i) for i in range(4))]
    lines = fit(columns, [("a-name", figures)], 20)
    assert all(whole(f, lines[-1]) for f in figures), lines
    assert len(lines[-1]) > 20  # wider than asked: the terminal wraps it, no figure is cut


def test_text_wraps_between_fields_and_at_spaces_never_inside_a_word() -> None:
    line = "  created 2026-12-01T00:00:00.000Z  driven 2026-12-01T00:00:00.750Z  still running"
    assert wrap([line], 40) == [
        "  created 2026-12-01T00:00:00.000Z",
        "      driven 2026-12-01T00:00:00.750Z",
        "      still running",
    ]
    assert wrap(["  a " + "x" * 50], 20) == ["  a", "      " + "x" * 50]  # a word longer than the width stays whole
    assert wrap([line], None) == [line]


# -- wording --------------------------------------------------------------------------------------


def test_show_of_a_running_run_says_it_is_running_not_finished_none() -> None:
    text = describe(a_run(RunStatus.running))
    assert "None" not in text and "still running" in text.splitlines()[2]
    queued = a_run(RunStatus.queued).model_copy(update={"driven_at": None, "drives": 0})
    assert "queued: no drive has it yet" in describe(queued) and "None" not in describe(queued)
    parked = a_run(RunStatus.awaiting_approval).model_copy(update={"parked_at": "2026-12-01T00:01:00.000Z"})
    assert "waiting for a person since 2026-12-01T00:01:00.000Z" in describe(parked)
    ended = a_run(RunStatus.completed).model_copy(update={"finished_at": "2026-12-01T00:02:00.000Z"})
    assert "finished 2026-12-01T00:02:00.000Z" in describe(ended) and "still" not in describe(ended).splitlines()[2]


def test_counts_take_their_singular_and_their_plural() -> None:
    run = a_run()
    text = describe(run)
    assert "1 attempt, 1 call, 1,801 tokens" in text and "0 attempts, 0 calls, 0 tokens" in text
    assert "(s)" not in text and "1 drive " in text
    one = render(run.model_copy(update={"steps": run.steps[:1]}))
    many = render(run)
    from io import StringIO

    from rich.console import Console

    def said(view: Any) -> str:
        console = Console(width=200, file=StringIO(), color_system=None)
        with console.capture() as captured:
            console.print(view)
        return captured.get()

    assert "prompt cache: 1 cold prefix, 0 tokens read, 12,345 written" in said(one)
    assert "1 cold prefix, 24,690 tokens read" in said(many) and "prefix(es)" not in said(many)
