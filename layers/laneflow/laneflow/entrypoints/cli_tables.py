"""Tables and text for the command line's stdout that fit the terminal without cutting a figure.

A table is drawn with rich. Its figures (costs, tokens, counts, times) and the names a
person copies (a run's id) are never cut or folded: their column is as wide as its widest
cell. Text columns (flows, lanes, statuses, questions) fold to what is left. When the
terminal is narrow the table tries, in order, headers wrapped at their spaces, the short
headers some columns have, one space between columns, no indent, then leaving out the
columns marked optional (a run's creation time: its id carries it); past that, it is drawn wider than the
terminal (the terminal wraps it) rather than cut a figure. Lines of text are wrapped at
spaces, never inside a word.

On a terminal the width is COLUMNS when set, else the terminal's; piped or redirected,
nothing is wrapped (one line a row, for grep), and nothing is styled.
"""

from __future__ import annotations

import io
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from laneflow.settings import environ

TEXT_MIN = 6  # what a text column keeps at least, of its widest cell, before the table gives up fitting


@dataclass(frozen=True)
class Column:
    """One column: its header, how a row gives its cell, whether it is a figure (`right`:
    right-aligned, never cut), whether it must stay whole though it is text (`whole`: a
    run's id), its header when the terminal is narrow (`short`), whether it may be left
    out when the terminal is too narrow (`optional`), and the width a text column keeps
    (`min_width`)."""

    header: str
    cell: Callable[[Any], str]
    right: bool = False
    whole: bool = False
    short: str | None = None
    optional: bool = False
    min_width: int = TEXT_MIN

    @property
    def fixed(self) -> bool:
        return self.right or self.whole


def output_width(stream: TextIO | None = None) -> int | None:
    """How wide stdout's lines may be when `stream` (stdout) is a terminal: COLUMNS when set,
    else the terminal's width. None when it is a pipe or a file, whatever COLUMNS says (test
    runners and CI set it): each row stays one line there."""
    stream = stream or sys.stdout
    if not getattr(stream, "isatty", lambda: False)():
        return None
    columns = environ().get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns


def styled(stream: TextIO | None = None) -> bool:
    """Bold headers only on a terminal that wants them (not NO_COLOR, not TERM=dumb)."""
    from laneflow.entrypoints.progress import plain_wanted

    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not plain_wanted()


@dataclass(frozen=True)
class _Plan:
    columns: list[Column]
    wrap_headers: bool
    short: bool
    gap: int


def _header(col: Column, plan: _Plan) -> str:
    return (col.short or col.header) if plan.short else col.header


def _fixed_width(col: Column, cells: list[str], plan: _Plan) -> int:
    header = _header(col, plan)
    head = max(map(cell_len, header.split())) if plan.wrap_headers else cell_len(header)
    return max([head, *map(cell_len, cells)])


def _needed(plan: _Plan, cells: dict[int, list[str]], indent: int) -> int:
    widths = []
    for col in plan.columns:
        if col.fixed:
            widths.append(_fixed_width(col, cells[id(col)], plan))
        else:
            natural = max([cell_len(_header(col, plan)), *map(cell_len, cells[id(col)])])
            widths.append(min(natural, col.min_width))
    return indent + sum(widths) + plan.gap * (len(widths) - 1)


def _plans(columns: list[Column]) -> Iterable[_Plan]:
    """From the roomiest to the tightest: all columns, headers whole; wrapped; short; one
    space apart; then without each optional column, the last first."""
    optional = [c for c in columns if c.optional]
    for dropped in range(len(optional) + 1):
        left_out = optional[len(optional) - dropped :]
        kept = [c for c in columns if c not in left_out]
        yield _Plan(kept, wrap_headers=False, short=False, gap=2)
        yield _Plan(kept, wrap_headers=True, short=False, gap=2)
        yield _Plan(kept, wrap_headers=True, short=True, gap=2)
        yield _Plan(kept, wrap_headers=True, short=True, gap=1)


def fit(columns: Sequence[Column], rows: Sequence[Any], width: int | None, *, indent: str = "", bold: bool = False) -> list[str]:
    """The rows as lines of a table under a header, fitting `width` (None: as wide as it is)
    without cutting or folding a figure (see the module's docstring)."""
    columns = list(columns)
    cells = {id(c): [c.cell(r) for r in rows] for c in columns}
    plans = list(_plans(columns))
    if width is None:
        plan = plans[0]
    else:
        found = next((p for p in plans if _needed(p, cells, len(indent)) <= width), None)
        if found is None:  # the plans again, flush left
            indent = ""
            found = next((p for p in plans if _needed(p, cells, 0) <= width), plans[-1])
        plan = found
    widths = _widths(plan, cells, None if width is None else width - len(indent))
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, plan.gap, 0, 0), header_style="bold" if bold else "")
    for col, w in zip(plan.columns, widths, strict=True):
        table.add_column(_header(col, plan), justify="right" if col.right else "left", width=w, overflow="fold")
    for i in range(len(rows)):
        table.add_row(*(cells[id(col)][i] for col in plan.columns))
    drawn = sum(widths) + plan.gap * (len(widths) - 1)
    return [indent + line if line.strip() else line for line in _render(table, drawn, bold)]


def _widths(plan: _Plan, cells: dict[int, list[str]], room: int | None) -> list[int]:
    """Each column's width: a figure's (or a whole column's) its widest cell; the text
    columns share what is left, the widest shrinking first, none below its minimum (past
    that the table is wider than `room`: the terminal wraps it, no figure is cut)."""
    fixed = {id(c): _fixed_width(c, cells[id(c)], plan) for c in plan.columns if c.fixed}
    text = [c for c in plan.columns if not c.fixed]
    natural = {
        id(c): max([cell_len(w) for w in _header(c, plan).split()] + [cell_len(v) for v in cells[id(c)]] + [1]) for c in text
    }
    if not plan.wrap_headers:
        natural = {id(c): max(natural[id(c)], cell_len(_header(c, plan))) for c in text}
    # A text column keeps its minimum, and at least its header's longest word (never folded).
    floor = {id(c): min(natural[id(c)], max(c.min_width, *map(cell_len, _header(c, plan).split()))) for c in text}
    left = None if room is None else room - sum(fixed.values()) - plan.gap * (len(plan.columns) - 1)
    if left is None or left >= sum(natural.values()):
        given = natural
    else:
        # The largest cap that fits: every text column min(natural, max(floor, cap)).
        def at(cap: int) -> dict[int, int]:
            return {k: min(natural[k], max(floor[k], cap)) for k in natural}

        cap = max((c for c in range(max(natural.values()) + 1) if sum(at(c).values()) <= left), default=0)
        given = at(cap)
        spare = left - sum(given.values())
        for k in natural:  # what the cap leaves over, a column at a time
            if spare > 0 and given[k] < natural[k]:
                given[k] += 1
                spare -= 1
    return [fixed[id(c)] if c.fixed else given[id(c)] for c in plan.columns]


def _render(renderable: Any, width: int, bold: bool) -> list[str]:
    console = Console(
        file=io.StringIO(),
        width=max(width, 1),
        force_terminal=bold,
        color_system="standard" if bold else None,
        highlight=False,
        emoji=False,
        markup=False,
    )
    with console.capture() as captured:
        console.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]


def wrap(lines: Iterable[str], width: int | None, hang: int = 4) -> list[str]:
    """Lines fitted to `width` (None: as they are): broken first between the fields a line
    separates with two spaces, then at spaces, each continuation indented `hang` more than
    its line. A word (a figure, an id) is never broken, so a word longer than the width
    stays longer."""
    out: list[str] = []
    for line in lines:
        if width is None or cell_len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip(" "))
        pad = " " * (lead + hang)
        packed: list[str] = []
        for field in line[lead:].split("  "):
            # A field starts a line of its own only when it fits one; a longer one goes on
            # after the last and is broken at its spaces below.
            if not packed or (cell_len(f"{packed[-1]}  {field}") > width and cell_len(pad + field) <= width):
                packed.append(f"{pad if packed else ' ' * lead}{field}")
            else:
                packed[-1] = f"{packed[-1]}  {field}"
        for part in packed:
            out.extend(
                textwrap.wrap(part, width, subsequent_indent=pad, break_long_words=False, break_on_hyphens=False) or [part]
            )
    return out
