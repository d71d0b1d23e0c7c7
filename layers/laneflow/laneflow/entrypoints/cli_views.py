"""What the command line prints on stdout: `show` (a run with its lanes, steps, durations,
gate waits, cache breaks, what the prompt cache saved and events), `runs` (a table with a
header, its columns a list others can extend) and `estimate` (a table per lane). Each takes
the width to fit (`cli_tables`: no figure is ever cut; None: as wide as it is, for pipes);
no escape codes unless asked for bold headers. The live view is `progress`."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from laneflow.domain.lanes_report import gate_wait_ms, lane_rows
from laneflow.domain.records import Event, Run, RunStatus, Step, StepStatus
from laneflow.entrypoints.cli_base import plural
from laneflow.entrypoints.cli_tables import Column, fit, wrap
from laneflow.entrypoints.progress import MARK, step_label

__all__ = ["Column", "asking_column", "describe", "estimate_text", "new_lines", "runs_table"]


def _short(text: str, width: int = 80) -> str:
    """The first line of a text, cut to `width` characters (saying so)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= width else first[: width - 1] + "…"


def _at(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def usd(value: float) -> str:
    """Dollars to four places, the sign before the $ (a saving can be below zero)."""
    return f"{'-' if value < 0 else ''}${abs(value):.4f}"


def duration(start: str | None, end: str | None) -> str:
    """`1.234s` between two stored times ("" when either is missing)."""
    if not start or not end:
        return ""
    return f"{(_at(end) - _at(start)).total_seconds():.3f}s"


# -- runs -------------------------------------------------------------------------------------


# `laneflow runs`: add a column by appending to this list.
RUN_COLUMNS: list[Column] = [
    Column("RUN", lambda r: r.id, whole=True),
    Column("STATUS", lambda r: str(r.status), min_width=9),  # "awaiting-" over "approval"
    Column("FLOW", lambda r: f"{r.workspace}/{r.flow}", min_width=5),
    Column("COST", lambda r: f"${r.cost_usd:.4f}", right=True),
    Column("DRIVES", lambda r: str(r.drives), right=True, short="DRV"),
    Column("CREATED", lambda r: r.created_at, whole=True, optional=True),  # the run's id carries the time too
]


def asking_column(asking: dict[str, list[int]]) -> Column:
    """Which steps of each run wait on a person's answer (their ask tool): run id -> indexes."""
    return Column("ASKING", lambda r: ", ".join(f"step {i}" for i in asking.get(r.id, [])), short="ASK", min_width=4)


def runs_table(runs: list[Run], extra: list[Column] | None = None, width: int | None = None, *, bold: bool = False) -> str:
    return "\n".join(fit(RUN_COLUMNS + list(extra or []), runs, width, bold=bold)) if runs else "no runs yet"


LANE_COLUMNS: list[Column] = [
    Column("GROUP", lambda r: str(r["group"]), right=True, short="G"),
    Column("CYCLE", lambda r: str(r["cycle"]), right=True, short="CY"),
    Column("LANE", lambda r: r["lane"]),
    Column("STEPS", lambda r: str(r["steps"]), right=True, short="N"),
    Column("COLD", lambda r: str(r["cold_prefixes"]), right=True),
    Column("CACHE READ", lambda r: f"{r['cache_read']:,}", right=True),
    Column("CACHE WRITE", lambda r: f"{r['cache_write']:,}", right=True),
    Column("GATE WAIT", lambda r: f"{r['gate_wait_ms'] / 1000:.3f}s", right=True),
    Column("SAVED", lambda r: usd(r.get("savings_usd", 0.0)), right=True),
    Column("GATE SAVED", lambda r: usd(r.get("gate_savings_usd", 0.0)), right=True),
]


# -- show -----------------------------------------------------------------------------------------


def event_line(event: Event, since: str | None) -> str:
    at = f"{(_at(event.t) - _at(since)).total_seconds():+.3f}s" if since else event.t
    attempt = f" (attempt {event.attempt})" if event.attempt and event.attempt > 1 else ""
    return f"{at:>10} {event.type}{attempt}: {_short(event.text, 160)}"


def _step_lines(s: Step, run: Run) -> list[str]:
    calls = len(s.calls)
    tokens = sum(c.tokens.input + c.tokens.output for c in s.calls)
    took = duration(s.started_at, s.finished_at)
    lines = [
        f"  {MARK[s.status]} {s.index}: {step_label(s)}  [{s.status}] model {s.model}, "
        f"{plural(s.attempts, 'attempt')}, {plural(calls, 'call')}, {plural(tokens, 'token')}, ${s.cost_usd:.4f}"
        + (f" (cache saved {usd(s.savings_usd)})" if s.savings_usd else "")
        + (f", {took}" if took else "")
    ]
    waited = gate_wait_ms(s)
    if waited:
        lines.append(f"      gate wait: {waited / 1000:.3f}s (for its lane's lead)")
    read, written = sum(c.tokens.cache_read for c in s.calls), sum(c.tokens.cache_write for c in s.calls)
    hour = sum(c.tokens.cache_write_1h for c in s.calls)
    if read or written:
        lines.append(
            f"      prompt cache: {plural(read, 'token')} read, {written:,} written"
            + (f" ({hour:,} with the 1-hour TTL)" if hour else "")
        )
    if s.cache_break:
        lines.append(f"      cache break: {s.cache_break.get('layer')} changed since {s.cache_break.get('since')}")
    for c in s.calls:
        ttft = f", first token {c.ttft_ms} ms" if c.ttft_ms is not None else ""
        lines.append(
            f"      call {c.n}: {c.ms} ms{ttft}, in {c.tokens.input}, out {c.tokens.output}, "
            f"cache {c.tokens.cache_read} read / {c.tokens.cache_write} written, {plural(c.tools, 'tool call')}, {c.stop or '-'}"
        )
    if s.error and s.status != StepStatus.completed:
        lines.append(f"      error: {s.error}")
    if s.skip_reason:
        lines.append(f"      skipped: {s.skip_reason}")
    if s.message:
        lines.append(f"      message: {_short(s.message)} ({len(s.message):,} chars)")
    if s.conclusion:
        first = s.conclusion.strip().splitlines()[0] if s.conclusion.strip() else ""
        lines.append(f"      → {first[:100]}")
    if s.prompt_layers:
        layers = " ".join(f"{layer.name}{'*' if layer.dynamic else ''}:{layer.chars}" for layer in s.prompt_layers)
        lines.append(f"      layers: {layers}")
    if s.events:
        lines.append("      events:")
        lines.extend("        " + event_line(e, run.driven_at or run.created_at) for e in s.events)
    return lines


def _times(run: Run) -> str:
    """When the run was created, driven and finished; what it is doing now when it has not."""
    said = [f"created {run.created_at}"]
    if run.driven_at:
        said.append(f"driven {run.driven_at}")
    if run.finished_at:
        said.append(f"finished {run.finished_at}")
    elif run.status == RunStatus.awaiting_approval:
        said.append(f"waiting for a person since {run.parked_at}" if run.parked_at else "waiting for a person")
    elif run.status == RunStatus.queued:
        said.append("queued: no drive has it yet" if not run.driven_at else "queued for its next drive")
    else:
        said.append(f"still {run.status}")
    return "  ".join(said)


def describe(run: Run, width: int | None = None, *, bold: bool = False) -> str:
    """`laneflow show`: the run, its lanes (a table) and its steps, fitting `width` (None:
    as long as each line is)."""
    revision = run.revision or ""
    if width is not None and len(revision) + 11 > width:  # a hash is not a figure: its head names it (--json: all of it)
        revision = revision[: revision.find(":") + 13] + "…"
    lines = [
        f"run {run.id}  {run.status}",
        f"  flow {run.workspace}/{run.flow}" + (f"  revision {revision}" if revision else ""),
        f"  {_times(run)}",
        f"  {plural(run.drives, 'drive')}  cost ${run.cost_usd:.4f}  cache saved {usd(run.savings_usd)}"
        + (f"  queued {duration(run.created_at, run.driven_at)}" if run.driven_at else "")
        + (f"  took {duration(run.driven_at or run.created_at, run.finished_at)}" if run.finished_at else ""),
    ]
    if run.error:
        lines.append(f"  error: {run.error}")
    chain = [f"from {run.options['chained_from']}"] if run.options.get("chained_from") else []
    chain += [f"then {run.then_run}"] if run.then_run else []
    if chain:
        lines.append(f"  chain: {' '.join(chain)}")
    if run.schedule_id:
        lines.append(f"  schedule: {run.schedule_id}, its firing at {run.scheduled_at}")
    lines.append(f"  input: {json.dumps(run.input, ensure_ascii=False)[:200]}")
    lines = wrap(lines, width)
    rows = lane_rows(run.steps)
    if rows:
        lines.append("lanes (what the prompt cache did):")
        lines.extend(fit(LANE_COLUMNS, rows, width, indent="  ", bold=bold))
    group = None
    for s in run.steps:
        if s.group != group:
            group = s.group
            lines.append(f"group {group}")
        lines.extend(wrap(_step_lines(s, run), width))
    return "\n".join(lines)


def new_lines(run: Run, seen: dict[int, tuple[str, int]]) -> list[str]:
    """`show --follow`: what happened since the last look (status changes, new events)."""
    out = []
    for s in run.steps:
        status, count = seen.get(s.index, ("", 0))
        if str(s.status) != status:
            took = duration(s.started_at, s.finished_at)
            out.append(f"step {s.index} {step_label(s)}: {s.status}" + (f" ({took}, ${s.cost_usd:.4f})" if took else ""))
        for e in s.events[count:]:
            out.append(f"step {s.index} {step_label(s)}: {event_line(e, run.driven_at or run.created_at).strip()}")
        seen[s.index] = (str(s.status), len(s.events))
    return out


# -- estimate -----------------------------------------------------------------------------------


ESTIMATE_COLUMNS: list[Column] = [
    Column("G", lambda r: str(r["group"]), right=True),
    Column("LANE", lambda r: r["lane"]),
    Column("N", lambda r: str(r["steps"]), right=True),
    Column("PREFIX", lambda r: f"{r['prefix_tokens']:,}" + ("" if r["cacheable"] else "*"), right=True),
    Column("LEAD", lambda r: r["lead"] + ("+" if r["lead_reads"] else "")),
    Column("GATED W/R", lambda r: f"{r['with_gate']['cache_write']:,}/{r['with_gate']['cache_read']:,}", right=True),
    Column("UNGATED W/R", lambda r: f"{r['without_gate']['cache_write']:,}/{r['without_gate']['cache_read']:,}", right=True),
    Column("COST", lambda r: f"${r['with_gate']['cost_usd']:.4f}", right=True),
]


def _lead_lines(lanes: list[dict[str, Any]]) -> list[str]:
    """Why a lane's lead reads its prefix instead of writing it, one line a lane."""
    out = []
    for lane in lanes:
        if not lane["lead_reads"]:
            continue
        warm = lane.get("warm_now")
        when = f", since {warm['since']}, until {warm['until']}" if warm else ""
        out.append(f"  + G{lane['group']} {lane['lane']}: {lane['lead_reads']}{when}: its lead reads the prefix, no cold one")
    return out


def estimate_text(data: dict[str, Any], width: int | None = None, *, bold: bool = False) -> str:
    """`laneflow estimate`: a table of lanes, then the totals, the cost range and what was
    assumed, fitting `width` (None: as long as each line is)."""
    cost = data["cost_usd"]
    totals = data["totals"]
    table = fit(ESTIMATE_COLUMNS, data["lanes"], width, indent="  ", bold=bold)
    lines = [f"estimate of {data['workspace']}/{data['flow']} (nothing has run; W/R: cache tokens written/read)"]
    lines.extend(_lead_lines(data["lanes"]))
    lines.append(
        f"  cold prefixes: {totals['with_gate']['cold_prefixes']} with the gate, {totals['without_gate']['cold_prefixes']} without"
    )
    lines.append(
        f"  expected cost ${cost['expected']:.4f} with the gate (${cost['without_gate']:.4f} without); "
        f"range ${cost['low']:.4f} to ${cost['high']:.4f}"
    )
    lines.append(f"  range: {data['range_rule']}")
    learned = data.get("output_learned_from")
    assumed = (
        f"  turns and output: what {learned} measured per step of each agent on Claude (else {data['output_tokens_per_turn']}"
        " tokens in one turn)"
        if learned
        else f"  output assumed: {data['output_tokens_per_turn']} tokens in one turn a step on Claude (--output-tokens)"
    )
    lines.append(assumed + "; the stub's answers are its own")
    if any(not lane["cacheable"] for lane in data["lanes"]):
        lines.append("  * below the model's minimum cacheable prefix: nothing is cached")
    if data["unpriced_models"]:
        lines.append(f"  no price in the catalog for: {', '.join(data['unpriced_models'])} (counted as $0)")
    title, *notes = lines
    return "\n".join([*wrap([title], width), *table, *wrap(notes, width)])
