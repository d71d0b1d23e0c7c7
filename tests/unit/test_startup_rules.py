"""How a drive here is sized and how the program leaves: a small run's steps run in the
engine's process unless a count is given, a run all on the stub gets one worker at most (its
calls all go to one), and only the program's own command (not `main` called in-process)
leaves the collector's work undone on its way out."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from laneflow.domain.records import Run, Step
from laneflow.entrypoints.cli import main
from laneflow.entrypoints.cli_base import STEPS_FOR_WORKERS, step_workers
from laneflow.settings import Settings


def _run(steps: int, model: str = "stub") -> Run:
    return Run(
        id="run-20261201-000000-aaaaaa",
        workspace="ws",
        flow="f",
        steps=[Step(index=i, group=0, model=model) for i in range(steps)],
    )


def test_a_drive_of_a_small_run_gets_no_step_workers_and_a_stub_run_one_unless_a_count_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cfg = Settings()
    assert step_workers(None, cfg) == 2  # a command's default, before it knows the run
    assert step_workers(None, cfg, _run(1)) == 0
    assert step_workers(None, cfg, _run(STEPS_FOR_WORKERS - 1, "claude-sonnet-4-6")) == 0
    assert step_workers(None, cfg, _run(STEPS_FOR_WORKERS)) == 1  # all on the stub: its calls go to one
    assert step_workers(None, cfg, _run(STEPS_FOR_WORKERS, "claude-sonnet-4-6")) == 2
    mixed = _run(STEPS_FOR_WORKERS)
    mixed.steps[-1].model = "claude-haiku-4-5"
    assert step_workers(None, cfg, mixed) == 2
    # a count given, by the flag or the variable, is what the drive gets whatever the run
    assert step_workers(2, cfg, _run(1)) == 2
    assert step_workers(None, Settings.from_env({"LANEFLOW_STEP_WORKERS": "3"}), _run(1)) == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert step_workers(None, cfg, _run(STEPS_FOR_WORKERS)) == 0


def test_main_called_in_process_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    before = gc.get_freeze_count()
    assert main(["runs", "--store", f"sqlite:///{tmp_path / 'lf.db'}"]) == 0
    assert gc.get_freeze_count() == before


def test_the_program_s_own_command_leaves_without_the_collector_s_passes(tmp_path: Path) -> None:
    code = (
        "import gc, sys; from laneflow.entrypoints.cli import main; "
        f"sys.argv = ['laneflow', 'runs', '--store', 'sqlite:///{tmp_path / 'lf.db'}']; "
        "code = main(); print(code, gc.get_freeze_count() > 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["0", "True"]
