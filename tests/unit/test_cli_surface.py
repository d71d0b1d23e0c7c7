"""The command line's surface: every flag has help, `--version`, the closest name for a
mistyped command, `runs` as an aligned table, and the live view (fits any width, marks a
waiting sibling with its reason, shows the cost as it grows, plain under NO_COLOR/TERM=dumb)."""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from laneflow.domain.records import Event, EventType, ModelCall, Run, RunStatus, Step, StepStatus
from laneflow.entrypoints import progress
from laneflow.entrypoints.cli import build_parser, main
from laneflow.entrypoints.cli_views import RUN_COLUMNS, Column, runs_table
from laneflow.entrypoints.progress import Progress, render

ESCAPE = re.compile(r"\x1b")

WAITING = "prompt cache: waiting for the first researcher step's reply before starting, so this one reads its prefix"


def _actions(parser: argparse.ArgumentParser, path: str = "laneflow") -> Iterator[tuple[str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_flag_and_argument_of_every_command_has_help() -> None:
    missing = [f"{path} {action.dest}" for path, action in _actions(build_parser()) if not action.help]
    assert missing == []
    assert len(list(_actions(build_parser()))) > 40  # the walk reached the subcommands


def test_version_prints_laneflows_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and re.match(r"laneflow \S+", capsys.readouterr().out)


def test_a_mistyped_command_suggests_the_closest_and_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["rnu", "ws", "flow"])
    assert done.value.code == 2
    assert "no command 'rnu'; did you mean 'run'?" in capsys.readouterr().err


def _run(steps: list[Step], status: RunStatus = RunStatus.running) -> Run:
    return Run(id="run-20261201-000000-abcdef", workspace="newsroom-with-a-long-name", flow="brief", status=status, steps=steps)


def _fan_out() -> Run:
    lead = Step(
        index=0,
        group=0,
        agent="researcher",
        item="tides",
        status=StepStatus.running,
        attempts=1,
        started_at="2026-12-01T00:00:01.000Z",
        calls=[ModelCall(id="c1", cost_usd=0.0125)],
    )
    waiting = [
        Step(
            index=i,
            group=0,
            agent="researcher",
            item=f"topic number {i} with a long name",
            events=[Event(type=EventType.gate, text=WAITING)],
        )
        for i in range(1, 4)
    ]
    later = [Step(index=4, group=1, agent="writer"), Step(index=5, group=2, agent=None, instruction="Publish this brief?")]
    return _run([lead, *waiting, *later])


@pytest.mark.parametrize("width", [40, 80, 160])
def test_the_live_view_fits_the_terminal_at_any_width(width: int) -> None:
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    with console.capture() as captured:
        console.print(render(_fan_out(), 12.3))
    lines = captured.get().splitlines()
    assert lines and all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    text = captured.get()
    assert "$0.0125" in text[: width * 2]  # the running lead's spend, before any step ended
    assert "⏸" in text  # the waiting siblings are marked waiting, not running


def test_a_waiting_sibling_is_shown_waiting_with_the_gates_reason() -> None:
    console = Console(width=200, file=io.StringIO(), color_system=None)
    with console.capture() as captured:
        console.print(render(_fan_out()))
    lines = captured.get().splitlines()
    waiting = [line for line in lines if "⏸ 1 researcher" in line]
    assert waiting and "waiting: waiting for the first researcher step's reply" in waiting[0]
    assert any("▶ 0 researcher (tides)" in line and "attempt 1" in line for line in lines)


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_and_a_dumb_terminal_get_plain_lines_with_no_escape_codes(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    shown = Progress(out)
    assert not shown.live
    run = _fan_out()
    shown.update(run)
    run.steps[1].status, run.steps[1].started_at, run.steps[1].attempts = StepStatus.running, "2026-12-01T00:00:02.000Z", 1
    shown.update(run)
    shown.update(run.model_copy(update={"status": RunStatus.completed}))
    text = out.getvalue()
    assert not ESCAPE.search(text)
    assert f"step 2 researcher (topic number 2 with a long name): waiting ({WAITING})" in text
    assert "step 1 researcher (topic number 1 with a long name): running" in text
    assert "run run-20261201-000000-abcdef: completed" in text


def test_a_terminal_gets_the_live_view_drawn_with_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    shown = Progress(out, width=60)
    assert shown.live
    shown.update(_fan_out())
    shown.close()
    assert ESCAPE.search(out.getvalue()) and "group 0" in out.getvalue()
    assert progress.plain_wanted({"NO_COLOR": ""}) and not progress.plain_wanted({"TERM": "xterm"})


def test_runs_is_a_table_with_a_header_and_aligned_columns_others_can_extend() -> None:
    runs = [
        Run(id="run-20261201-000000-aaaaaa", workspace="newsroom", flow="brief", status=RunStatus.completed, cost_usd=0.041),
        Run(
            id="run-20261201-000001-bbbbbb",
            workspace="ws",
            flow="a-much-longer-flow",
            status=RunStatus.awaiting_approval,
            cost_usd=12.5,
        ),
    ]
    header, *rows = runs_table(runs).splitlines()
    assert header.split() == ["RUN", "STATUS", "FLOW", "COST", "DRIVES", "CREATED"]
    assert len({line.index(run.created_at) for line, run in zip(rows, runs, strict=True)}) == 1  # one column
    assert rows[0].index("$0.0410") + len("$0.0410") == rows[1].index("$12.5000") + len("$12.5000")  # right-aligned
    RUN_COLUMNS.append(Column("QUESTIONS", lambda r: "0", right=True))
    try:
        assert runs_table(runs).splitlines()[0].split()[-1] == "QUESTIONS"
    finally:
        RUN_COLUMNS.pop()
    assert runs_table([]) == "no runs yet"


def test_plain_lines_say_a_run_ended_after_its_last_step_ended() -> None:
    """The run's ending line comes after the step changes seen in the same update, so the
    last line of a finished run's progress is the run's own."""
    out = io.StringIO()
    shown = Progress(out, live=False)
    run = _fan_out()
    shown.update(run)
    last = run.steps[-1]
    last.status, last.started_at, last.attempts = StepStatus.completed, "2026-12-01T00:00:02.000Z", 1
    shown.update(run.model_copy(update={"status": RunStatus.completed}))
    lines = out.getvalue().splitlines()
    assert "run run-20261201-000000-abcdef: completed" in lines[-1]
    assert any(f"step {last.index} " in line and ": completed" in line for line in lines[:-1])


def test_commands_that_drive_get_a_step_worker_per_core_up_to_four_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from laneflow.domain.errors import InvalidInput
    from laneflow.entrypoints.cli import step_workers
    from laneflow.settings import Settings

    cfg = Settings()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert step_workers(None, cfg) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert step_workers(None, cfg) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert step_workers(None, cfg) == 0
    # the variable, read into the settings, wins over the machine; the flag over both
    given = Settings.from_env({"LANEFLOW_STEP_WORKERS": "3"})
    assert step_workers(None, given) == 3
    assert step_workers(None, given.model_copy(update={"secrets_file": "/s.env"})) == 3  # as the CLI copies them
    assert step_workers(0, given) == 0
    with pytest.raises(InvalidInput, match="--step-workers 33"):
        step_workers(33, cfg)
    with pytest.raises(InvalidInput, match=r"^LANEFLOW_STEP_WORKERS: Input should be greater than or equal to 0$"):
        Settings.from_env({"LANEFLOW_STEP_WORKERS": "-1"})


# -- a mistyped flag, the program as invoked, what the drive says while the run is queued --------


@pytest.mark.parametrize(
    "argv, usage, said",
    [
        (["runs", "--jsn"], "usage: laneflow runs ", "no flag '--jsn'; did you mean '--json'?"),
        (
            ["run", "ws", "flow", "--stroe", "sqlite:///x.db"],
            "usage: laneflow run ",
            "no flag '--stroe'; did you mean '--store'?",
        ),
        (["show", "run-x", "--folow"], "usage: laneflow show ", "no flag '--folow'; did you mean '--follow'?"),
        (["approve", "run-x", "--rejct=yes"], "usage: laneflow approve ", "no flag '--rejct'; did you mean '--reject'?"),
        (["show", "run-x", "--zzz"], "usage: laneflow show ", "unrecognized arguments: --zzz"),
        (["demo", "newsrom"], "usage: laneflow demo ", "no example 'newsrom'; did you mean 'newsroom'?"),
    ],
)
def test_a_mistyped_flag_names_the_closest_and_shows_its_commands_usage(
    argv: list[str], usage: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and err.rstrip().endswith(said), err
    assert "COMMAND ..." not in err  # not the top level's usage


def test_the_program_is_named_as_it_was_invoked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from laneflow.entrypoints.cli_base import hint, program

    script = tmp_path / "venv" / "bin" / "laneflow"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    # not on PATH: its path, absolute, whichever folder it was run from
    monkeypatch.chdir(tmp_path)
    assert program("venv/bin/laneflow", "") == str(script)
    # on PATH as this very script (or a link to it): the bare name
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert program(str(script), "") == "laneflow"
    linked = tmp_path / "bin"
    linked.mkdir()
    (linked / "laneflow").symlink_to(script)
    monkeypatch.setenv("PATH", f"{linked}:/usr/bin:/bin")
    assert program(str(script), "") == "laneflow"
    # another laneflow first on PATH: this one's path
    other = tmp_path / "other"
    other.mkdir()
    (other / "laneflow").write_text("#!/bin/sh\n")
    (other / "laneflow").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{script.parent}")
    assert program(str(script), "") == str(script)
    # python -m: the interpreter (its path unless PATH gives that very file) and the module
    assert program("/x/cli.py", "laneflow.entrypoints.cli") == f"{sys.executable} -m laneflow.entrypoints.cli"
    # called in-process (a test, a program of its own): the console script's name
    assert program("/usr/lib/python3/pytest", "pytest.__main__") == "laneflow"
    # a hint: the words quoted for a shell, then the store it was given
    spaced = argparse.Namespace(store="sqlite:///my runs/a.db")
    assert hint(spaced, "answer", "run-1", "0", "YOUR ANSWER").endswith(
        "laneflow answer run-1 0 'YOUR ANSWER' --store 'sqlite:///my runs/a.db'"
    )
    assert hint(argparse.Namespace(store=None), "show", "run-1").endswith("laneflow show run-1")


def test_a_queued_run_says_what_the_drive_is_doing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    queued = _run([Step(index=0, group=0, agent="writer")], RunStatus.queued)
    out = io.StringIO()
    shown = Progress(out, live=False)
    shown.phase("reconciling runs left behind")  # no run yet: nothing on plain lines
    shown.phase("starting the engine", queued)
    shown.phase("starting its drive", queued)
    shown.phase(None, queued.model_copy(update={"status": RunStatus.running}))
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "run run-20261201-000000-abcdef: queued (starting the engine) ($0.0000)",
        "run run-20261201-000000-abcdef: queued (starting its drive) ($0.0000)",
        "run run-20261201-000000-abcdef: running ($0.0000)",
    ]
    console = Console(width=100, file=io.StringIO(), color_system=None)
    with console.capture() as captured:
        console.print(render(queued, 1.0, "starting the engine"))
    assert captured.get().startswith("queued (starting the engine…) $0.0000")


def test_a_line_said_during_the_live_view_is_kept_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    shown = Progress(out, width=80)
    shown.phase("reconciling runs left behind")  # before the run: drawn, then wiped
    shown.update(_fan_out())
    shown.say("laneflow: step 0 (asker) asks a person: North or south?")
    shown.close()
    text = ESCAPE.sub("", out.getvalue())
    assert "reconciling runs left behind" in text and "step 0 (asker) asks a person: North or south?" in text
