"""Showing a run as it runs: a live view on a terminal, one plain line per change elsewhere.

The live view is drawn with rich and fits the terminal's width whatever it is (every line
is cut to it, with an ellipsis): the run's cost so far, each group's steps, the steps that
run and the siblings that wait for their lead (with the gate's reason), and what the prompt
cache did. Where colour and cursor movement are unwanted (`NO_COLOR` set, `TERM=dumb`, or
not a terminal) it prints one plain line per change, with no escape code at all.

While the run waits for its drive, the view says what the command is doing (`phase`:
reconciling, starting the engine, starting its drive), and lines a person must act on (a
question a step asks) are printed above it (`say`).

Everything here writes to stderr, so `--json` keeps stdout machine-clean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from laneflow import settings
from laneflow.adapters.logs import masked
from laneflow.domain.lanes_report import lane_rows, waiting_reason
from laneflow.domain.records import Run, Step, StepStatus
from laneflow.entrypoints.cli_base import plural

MARK = {
    StepStatus.pending: "·",
    StepStatus.running: "▶",
    StepStatus.completed: "✓",
    StepStatus.failed: "✗",
    StepStatus.skipped: "-",
    StepStatus.awaiting_approval: "?",
}

WAITING = "⏸"

STYLE = {
    StepStatus.running: "bold cyan",
    StepStatus.completed: "green",
    StepStatus.failed: "bold red",
    StepStatus.skipped: "dim",
    StepStatus.awaiting_approval: "yellow",
}

RUN_STYLE = {"running": "bold cyan", "completed": "bold green", "failed": "bold red", "awaiting-approval": "bold yellow"}

ACTIVE_SHOWN = 6  # running or waiting steps listed under the groups


def plain_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """NO_COLOR (any value) or TERM=dumb: plain lines, no colour and no cursor movement."""
    env = settings.environ() if environ is None else environ
    return "NO_COLOR" in env or env.get("TERM", "") == "dumb"


def step_label(step: Step) -> str:
    if step.agent is None:
        return f"approval: {step.instruction}"
    item = ""
    if step.item is not None:
        text = step.item if isinstance(step.item, str) else str(step.item)
        item = f" ({text[:40]}{'…' if len(text) > 40 else ''})"
    return f"{step.agent}{item}"


def live_cost(run: Run) -> float:
    """The run's cost so far: its ended steps' cost, plus the spans its running steps have
    reported (the run's own figure grows as steps end)."""
    steps = sum(s.cost_usd for s in run.steps)
    running = sum(c.cost_usd for s in run.steps if s.status == StepStatus.running for c in s.calls)
    return max(run.cost_usd, steps + running)


def _line(*parts: tuple[str, str]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for content, style in parts:
        text.append(content, style=style)
    return text


def _group_line(group: int, steps: list[Step]) -> Text:
    agents = ", ".join(dict.fromkeys(s.agent or "approval" for s in steps))
    done = sum(1 for s in steps if s.status.ended)
    line = _line((f"group {group} ", "bold"), (f"{done}/{len(steps)} ", ""))
    if len(steps) <= 40:
        for s in steps:
            waiting = waiting_reason(s) is not None
            line.append(WAITING if waiting else MARK[s.status], style="yellow" if waiting else STYLE.get(s.status, ""))
    else:
        counts = {status: sum(1 for s in steps if s.status == status) for status in MARK}
        line.append(" ".join(f"{MARK[st]}{n}" for st, n in counts.items() if n))
    line.append(f"  {agents}", style="dim")
    return line


def render(run: Run, elapsed_s: float = 0.0, phase: str | None = None) -> Group:
    """The live view of a run: one renderable whose every line fits the console's width.
    `phase`: what the command is doing while the run waits (said after its status)."""
    steps = [s for s in run.steps if s.rescue_of is None]
    # What matters most first, so a narrow terminal cuts the least useful end: the status
    # (and what is being done for it), the cost so far, the time, then which run.
    lines = [
        _line(
            (f"{run.status} ", RUN_STYLE.get(str(run.status), "bold")),
            *([(f"({phase}…) ", "yellow")] if phase else []),
            (f"${live_cost(run):.4f} ", "bold green"),
            (f"{elapsed_s:.1f}s ", "dim"),
            (f"{run.workspace}/{run.flow} ", ""),
            (run.id, "dim"),
        )
    ]
    for g in sorted({s.group for s in steps}):
        lines.append(_group_line(g, [s for s in steps if s.group == g]))
    active = [s for s in steps if s.status == StepStatus.running or waiting_reason(s)]
    for s in active[:ACTIVE_SHOWN]:
        reason = waiting_reason(s)
        if reason:
            lines.append(
                _line(
                    (f"  {WAITING} {s.index} {step_label(s)} ", "yellow"),
                    (f"waiting: {reason.removeprefix('prompt cache: ')}", "dim"),
                )
            )
        else:
            lines.append(_line((f"  ▶ {s.index} {step_label(s)} ", "cyan"), (f"attempt {s.attempts}", "dim")))
    if len(active) > ACTIVE_SHOWN:
        lines.append(_line((f"  … {len(active) - ACTIVE_SHOWN} more", "dim")))
    rows = lane_rows(run.steps)
    if any(r["cache_read"] or r["cache_write"] for r in rows):
        cold = sum(r["cold_prefixes"] for r in rows)
        read, written = sum(r["cache_read"] for r in rows), sum(r["cache_write"] for r in rows)
        said = f"prompt cache: {plural(cold, 'cold prefix', 'cold prefixes')}, {plural(read, 'token')} read, {written:,} written"
        lines.append(_line((said, "dim")))
    return Group(*lines)


class Progress:
    """Call `update(run)` as often as you like (a run read with its steps' detail, so the
    gate's waits are seen); it redraws (a terminal) or prints what changed. `phase(text)`
    says what the command is doing until the run's drive has it; `say(line)` prints a line a
    person must read (above the live view)."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, width: int | None = None):
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.live = (isatty and not plain_wanted()) if live is None else live
        self.started = time.monotonic()
        self._seen: dict[int, tuple[StepStatus, int, bool]] = {}
        self._run_status: tuple[str, str | None] | None = None
        self._run: Run | None = None
        self._phase: str | None = None
        self._live: Live | None = None
        self._done = False
        self._console = (
            Console(file=self.stream, width=width, force_terminal=self.live or None, no_color=plain_wanted())
            if self.live
            else None
        )

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def update(self, run: Run) -> None:
        self._run = run
        if self.live:
            self._redraw(run)
        else:
            self._changes(run)

    def phase(self, text: str | None, run: Run | None = None) -> None:
        """What the command is doing while the run waits for its drive (None: nothing more
        to say, the drive has it), drawn at once with `run` (else the last run given).
        Before there is any run, it is shown on a terminal only, and wiped when the run's
        view replaces it."""
        changed = text != self._phase
        self._phase = text
        shown = run or self._run
        if shown is not None and (run is not None or changed):
            self.update(shown)
        elif changed and self.live and text and not self._done:
            self._show(_line(("laneflow ", "bold"), (f"{text}…", "yellow")), transient=True)

    def say(self, line: str) -> None:
        """A line a person must read (a question to answer, with its command), kept above
        the live view, or among the plain lines."""
        if self._live is not None:
            self._live.console.print(Text(masked(line)), soft_wrap=True)
        else:
            self.stream.write(masked(line) + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Leave the last frame on the screen (a run's; a phase shown before any run is
        wiped); later updates draw nothing."""
        self._done = True
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _show(self, view: Text | Group, *, transient: bool) -> None:
        if self._live is not None and self._live.transient != transient:
            self._live.stop()  # a phase shown before the run: wiped, the run's view takes its place
            self._live = None
        if self._live is None:
            assert self._console is not None
            # Nothing else is redirected: stdout stays the record's (--json), stderr the errors'.
            self._live = Live(
                view, console=self._console, auto_refresh=False, transient=transient, redirect_stdout=False, redirect_stderr=False
            )
            self._live.start()
        self._live.update(view, refresh=True)

    def _redraw(self, run: Run) -> None:
        if self._done:
            return
        self._show(render(run, self._elapsed(), self._phase), transient=False)
        if run.status in ("completed", "failed", "awaiting-approval"):
            self.close()

    def _changes(self, run: Run) -> None:
        out = self.stream
        stamp = f"[{self._elapsed():5.1f}s]"
        # The run's own line goes after its steps' once it has ended (its last step's ending
        # comes before the run's), before them while it starts.
        ended = run.status in ("completed", "failed", "awaiting-approval")
        state = (str(run.status), None if ended else self._phase)
        doing = f" ({self._phase})" if self._phase and not ended else ""
        if state != self._run_status and not ended:
            self._run_status = state
            out.write(f"{stamp} run {run.id}: {run.status}{doing} (${live_cost(run):.4f})\n")
        for step in run.steps:
            reason = waiting_reason(step)
            key = (step.status, step.attempts, reason is not None)
            if self._seen.get(step.index) == key:
                continue
            self._seen[step.index] = key
            if reason:
                out.write(f"{stamp} group {step.group} step {step.index} {step_label(step)}: waiting ({reason})\n")
                continue
            if step.status == StepStatus.pending and step.attempts == 0:
                continue
            extra = f": {step.error}" if step.status == StepStatus.failed and step.error else ""
            cost = f" ${step.cost_usd:.4f}" if step.status.ended and step.cost_usd else ""
            out.write(f"{stamp} group {step.group} step {step.index} {step_label(step)}: {step.status}{extra}{cost}\n")
        if state != self._run_status and ended:
            self._run_status = state
            out.write(f"{stamp} run {run.id}: {run.status} (${live_cost(run):.4f})\n")
        out.flush()
