"""Showing a run as it runs: a live view on a terminal, one line per change elsewhere.

Everything here writes to stderr, so `--json` keeps stdout machine-clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from laneflow.domain.records import Run, Step, StepStatus

MARK = {
    StepStatus.pending: "·",
    StepStatus.running: "▶",
    StepStatus.completed: "✓",
    StepStatus.failed: "✗",
    StepStatus.skipped: "-",
    StepStatus.awaiting_approval: "?",
}



def step_label(step: Step) -> str:
    if step.agent is None:
        return f"approval: {step.instruction}"
    item = ""
    if step.item is not None:
        text = step.item if isinstance(step.item, str) else str(step.item)
        item = f" ({text[:40]}{'…' if len(text) > 40 else ''})"
    return f"{step.agent}{item}"



def _group_line(group: int, steps: list[Step]) -> str:
    agents = ", ".join(dict.fromkeys(s.agent or "approval" for s in steps))
    marks = "".join(MARK[s.status] for s in steps)
    if len(marks) > 40:
        counts = {status: sum(1 for s in steps if s.status == status) for status in MARK}
        marks = " ".join(f"{MARK[st]}{n}" for st, n in counts.items() if n)
    done = sum(1 for s in steps if s.status.ended)
    return f"  group {group}  {agents:<28.28} {done:>3}/{len(steps):<3} {marks}"



class Progress:
    """Call `update(run)` as often as you like; it redraws (TTY) or prints changes."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.started = time.monotonic()
        self._drawn = 0
        self._seen: dict[int, tuple[StepStatus, int]] = {}
        self._run_status: str | None = None

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:5.1f}s"

    def update(self, run: Run) -> None:
        if self.live:
            self._redraw(run)
        else:
            self._changes(run)

    def _redraw(self, run: Run) -> None:
        steps = [s for s in run.steps if s.rescue_of is None]
        groups = sorted({s.group for s in steps})
        lines = [f"laneflow  {run.workspace}/{run.flow}  {run.id}  {run.status}  ${run.cost_usd:.4f}  {self._elapsed()}"]
        for g in groups:
            lines.append(_group_line(g, [s for s in steps if s.group == g]))
        running = [s for s in steps if s.status == StepStatus.running][:3]
        for s in running:
            lines.append(f"    ▶ {s.index}: {step_label(s)}  attempt {s.attempts}")
        out = self.stream
        if self._drawn:
            out.write(f"\x1b[{self._drawn}F")
        for line in lines:
            out.write("\x1b[2K" + line + "\n")
        for _ in range(max(0, self._drawn - len(lines))):
            out.write("\x1b[2K\n")
        self._drawn = max(len(lines), self._drawn)
        out.flush()

    def _changes(self, run: Run) -> None:
        out = self.stream
        if run.status != self._run_status:
            self._run_status = run.status
            out.write(f"[{self._elapsed()}] run {run.id}: {run.status}\n")
        for step in run.steps:
            key = (step.status, step.attempts)
            if self._seen.get(step.index) == key:
                continue
            self._seen[step.index] = key
            if step.status == StepStatus.pending and step.attempts == 0:
                continue
            extra = f": {step.error}" if step.status == StepStatus.failed and step.error else ""
            out.write(f"[{self._elapsed()}] group {step.group} step {step.index} {step_label(step)}: {step.status}{extra}\n")
        out.flush()
