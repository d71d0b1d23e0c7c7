"""How bench/benchlib.py judges a goal: a timed goal measured on a busy machine (the 1-minute
load above its cores, before or after) is unmeasured, a count is judged whatever the load, and
a run with a missed measured goal exits 1."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load_benchlib() -> object:
    """bench/ is a folder of scripts, not a package: its shared module is loaded by path."""
    spec = importlib.util.spec_from_file_location("benchlib", BENCH / "benchlib.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchlib"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    import benchlib
else:
    benchlib = _load_benchlib()

QUIET, BUSY = 0.5, 3.5  # on the two cores the tests pretend to have


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlib, "cores", lambda: 2)


@pytest.mark.parametrize("loads", [(BUSY, QUIET), (QUIET, BUSY), (BUSY, BUSY)])
def test_a_timed_goal_seen_busy_before_or_after_is_unmeasured_whether_it_was_met_or_not(loads: tuple[float, float]) -> None:
    met = benchlib.Goal("wall", measured=1.0, limit=2.0, loads=loads)
    missed = benchlib.Goal("wall", measured=3.0, limit=2.0, loads=loads)
    assert (met.verdict, missed.verdict) == ("unmeasured", "unmeasured")
    assert benchlib.exit_code([met, missed]) == 0


@pytest.mark.parametrize("loads", [(BUSY, QUIET), (QUIET, QUIET)])
def test_a_count_is_judged_whatever_the_load(loads: tuple[float, float]) -> None:
    met = benchlib.Goal("reads", measured=4, limit=4, timed=False, loads=loads)
    missed = benchlib.Goal("reads", measured=5, limit=4, timed=False, loads=loads)
    assert (met.verdict, missed.verdict) == ("met", "NOT met")


def test_a_timed_goal_on_a_quiet_machine_is_met_or_missed_by_its_figure() -> None:
    assert benchlib.Goal("wall", 2.0, 2.0, loads=(QUIET, QUIET)).verdict == "met"
    assert benchlib.Goal("wall", 2.01, 2.0, loads=(QUIET, QUIET)).verdict == "NOT met"


def test_a_floor_is_met_at_or_above_its_limit() -> None:
    assert benchlib.Goal("inside", 5, 5, timed=False, floor=True).verdict == "met"
    assert benchlib.Goal("inside", 4, 5, timed=False, floor=True).verdict == "NOT met"


def test_a_goal_without_loads_reads_the_load_now(monkeypatch: pytest.MonkeyPatch) -> None:
    goal = benchlib.Goal("wall", 1.0, 2.0)
    seen = []
    for now in (BUSY, QUIET):
        monkeypatch.setattr(benchlib, "load", lambda now=now: now)
        seen.append(goal.verdict)
    assert seen == ["unmeasured", "met"]


def test_a_missed_measured_goal_exits_1_and_an_unmeasured_one_does_not() -> None:
    met = benchlib.Goal("a", 1, 2, loads=(QUIET, QUIET))
    missed_count = benchlib.Goal("b", 3, 2, timed=False, loads=(BUSY, BUSY))
    missed_time = benchlib.Goal("c", 3, 2, loads=(QUIET, QUIET))
    unmeasured = benchlib.Goal("d", 3, 2, loads=(BUSY, QUIET))
    assert benchlib.exit_code([met]) == 0
    assert benchlib.exit_code([met, unmeasured]) == 0
    assert benchlib.exit_code([met, missed_count]) == 1
    assert benchlib.exit_code([unmeasured, missed_time]) == 1


def test_the_table_prints_the_loads_seen_and_each_verdict() -> None:
    table = benchlib.goal_table(
        [benchlib.Goal("ratio", 1.2, 1.05, loads=(QUIET, BUSY)), benchlib.Goal("rows", 31, 40, timed=False, loads=(BUSY,))]
    )
    rows = table.splitlines()[2:]
    assert rows[0] == "| ratio | yes | 1.2 | <= 1.05 | 0.50 / 3.50 | unmeasured |"
    assert rows[1] == "| rows | no | 31 | <= 40 | 3.50 | met |"


def test_writing_a_section_keeps_the_others(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    benchlib.write_section(results, "a", "first a\n")
    benchlib.write_section(results, "b", "first b\n")
    benchlib.write_section(results, "a", "second a\n")
    text = results.read_text()
    assert "second a\n" in text and "first b\n" in text and "first a" not in text
    assert text.index("<!-- a:start -->") < text.index("<!-- b:start -->")


def test_a_measurement_in_parts_keeps_its_ends_and_a_busier_moment_between() -> None:
    assert benchlib.span([QUIET, 1.0, 0.8, 1.2]) == (QUIET, 1.2)
    assert benchlib.span([QUIET, BUSY, 0.8, 1.2]) == (QUIET, BUSY, 1.2)
    # Busy only between the ends: a timed goal over it is still unmeasured.
    assert benchlib.Goal("ratio", 1.0, 1.05, loads=benchlib.span([QUIET, BUSY, QUIET])).verdict == "unmeasured"


def test_the_load_note_says_busy_when_a_load_is_above_the_cores() -> None:
    assert benchlib.load_note(QUIET, 1.0) == "1-minute load 0.50, 1.00 (before, after) on 2 cores: not busy"
    assert benchlib.load_note(QUIET, BUSY, 1.0).endswith("(before, highest between, after) on 2 cores: busy")


def test_a_peak_started_again_names_only_what_came_after() -> None:
    # A child process allocates 200 MiB and frees it; its peak is started again, then it
    # allocates 20 MiB: the peak read says 20 MiB and more, far from 200.
    import subprocess
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(BENCH)!r})
        import benchlib
        big = bytearray(200 * 2**20); big[::4096] = b"x" * len(big[::4096]); del big
        before = benchlib.peak_rss_mib(os.getpid())
        assert benchlib.reset_peak(os.getpid())
        small = bytearray(20 * 2**20); small[::4096] = b"x" * len(small[::4096])
        print(before, benchlib.peak_rss_mib(os.getpid()))
        """
    )
    before, after = (
        float(x)
        for x in subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout.split()
    )
    assert before >= 200
    assert 20 <= after < 150
