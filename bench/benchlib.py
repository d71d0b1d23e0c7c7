"""What every benchmark shares: the machine it ran on, its load, and how a goal is judged.

A goal compares a measured figure with its limit, or with a second measured figure, and
can fail. A wall-time goal measured while the machine was busy (its 1-minute load above its
cores, before or after the figure was taken) says nothing about laneflow, so it is reported
as unmeasured rather than met or missed; counts (history events, cache writes, capacity
units) do not depend on the load and are judged whatever it is.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Verdict = Literal["met", "NOT met", "unmeasured"]


def cores() -> int:
    return os.cpu_count() or 1


def load() -> float:
    """The machine's 1-minute load average now."""
    return os.getloadavg()[0]


def busy(*loads: float) -> bool:
    """Whether any of these loads (or, with none, the load now) is above the machine's cores."""
    return any(each > cores() for each in (loads or (load(),)))


def span(loads: Sequence[float]) -> tuple[float, ...]:
    """The loads of a measurement taken in parts (before and after each), as a goal keeps them:
    the first, the highest between them where it is higher than both ends, and the last."""
    first, last = loads[0], loads[-1]
    highest = max(loads)
    return (first, highest, last) if highest > max(first, last) else (first, last)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    averages = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{cores()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}, {platform.system()}, "
        f"load average {averages} (1, 5, 15 min) as the figures were taken"
    )


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak(pid: int) -> bool:
    """Start a process's peak resident memory (VmHWM) again from what it holds now (Linux's
    `clear_refs`), so a peak read after names what came since; False where it cannot."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Goal:
    """One goal's judgement: `measured` against `limit` (at most, or at least with `floor`),
    with the loads seen while it was measured. `timed` goals are unmeasured on a busy machine."""

    name: str
    measured: float
    limit: float
    timed: bool = True
    floor: bool = False
    loads: tuple[float, ...] = ()
    unit: str = ""

    @property
    def verdict(self) -> Verdict:
        if self.timed and busy(*(self.loads or (load(),))):
            return "unmeasured"
        ok = self.measured >= self.limit if self.floor else self.measured <= self.limit
        return "met" if ok else "NOT met"

    def row(self, unit: str = "") -> str:
        unit = unit or self.unit
        sign = ">=" if self.floor else "<="
        seen = " / ".join(f"{x:.2f}" for x in self.loads) or f"{load():.2f}"
        timed = "yes" if self.timed else "no"
        return f"| {self.name} | {timed} | {self.measured:g}{unit} | {sign} {self.limit:g}{unit} | {seen} | {self.verdict} |"


def goal_table(goals: list[Goal], unit: str = "") -> str:
    """The goals as a table: each one's figure, limit, the loads seen while it was measured
    (before / after) and its verdict; the timed ones are those a busy machine leaves unmeasured."""
    lines = ["| goal | timed | measured | limit | load seen | verdict |", "|---|---|---|---|---|---|"]
    return "\n".join([*lines, *(each.row(unit) for each in goals)]) + "\n"


def load_note(*loads: float) -> str:
    """The loads a benchmark saw, for its text: `1-minute load 0.52, 1.10 (before, after) on
    2 cores: not busy`; three are a `span` (before, the highest between, after)."""
    seen = ", ".join(f"{x:.2f}" for x in loads) or f"{load():.2f}"
    which = {1: "now", 2: "before, after", 3: "before, highest between, after"}.get(len(loads) or 1, "seen")
    return f"1-minute load {seen} ({which}) on {cores()} cores: {'busy' if busy(*loads) else 'not busy'}"


def exit_code(goals: list[Goal]) -> int:
    """1 when a measured goal was missed; unmeasured goals neither pass nor fail a run."""
    return 1 if any(each.verdict == "NOT met" for each in goals) else 0


def write_section(path: Path, name: str, text: str) -> None:
    """Replace (or add) one benchmark's section of RESULTS.md, keeping the others."""
    marker_start, marker_end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{marker_start}\n{text}{marker_end}\n"
    current = path.read_text() if path.exists() else "# Benchmark results\n\nEach section is written by its benchmark script.\n\n"
    if marker_start in current:
        head, rest = current.split(marker_start, 1)
        tail = rest.split(marker_end, 1)[1].lstrip("\n")
        current = head + block + ("\n" + tail if tail else "")
    else:
        current = current.rstrip("\n") + "\n\n" + block
    path.write_text(current)
