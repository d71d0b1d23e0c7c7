"""The commands `laneflow` prints for a person to run next work as printed: pasted into a
shell (here: split as a shell would and run), from another folder too, they find the run.
They carry the `--store` the command was given and the program as it was invoked: the bare
`laneflow` only when PATH gives that very program, else the script's path, or
`PYTHON -m laneflow.entrypoints.cli`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES

pytestmark = pytest.mark.slow

LANEFLOW = Path(sys.executable).parent / "laneflow"
CTRL = FIXTURES / "ws_control"
SEM = FIXTURES / "ws_semantics"
HINT = re.compile(r"(see it|answer it|reject it|follow it): (.+)$", re.M)


def path_without_this_venv() -> str:
    here = LANEFLOW.parent.resolve()
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != here)


def sh(cmd: list[str], cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


def hints(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in HINT.finditer(done.stdout + done.stderr)}


def paste(hint: str, cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    """The hint as a person pastes it into a shell."""
    done = sh(shlex.split(hint), cwd, path)
    assert "no run" not in done.stderr, (hint, done.stderr)
    assert done.returncode == 0, (hint, done.stderr)
    return done


def folders(tmp_path: Path) -> tuple[Path, Path]:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    return here, elsewhere


def test_a_parked_runs_hints_name_the_script_and_the_store_and_work_as_printed(tmp_path: Path) -> None:
    # Given `laneflow` is not on PATH, and the script is run by its path with --store
    here, elsewhere = folders(tmp_path)
    path = path_without_this_venv()
    store = f"sqlite:///{tmp_path / 'hints.db'}"
    parked = sh([str(LANEFLOW), "run", str(CTRL), "approval", "--store", store], here, path)
    assert parked.returncode == 0, parked.stderr
    said = hints(parked)
    run_id = said["see it"].split()[2]
    assert said == {
        "see it": f"{LANEFLOW} show {run_id} --store {store}",
        "answer it": f"{LANEFLOW} approve {run_id} --store {store}",
        "reject it": f"{LANEFLOW} approve {run_id} --reject --store {store}",
    }
    # When each is pasted, from another folder: it finds the run
    shown = paste(said["see it"], elsewhere, path)
    assert shown.stdout.startswith(f"run {run_id}  awaiting-approval")
    approved = paste(said["answer it"], elsewhere, path)
    assert approved.stdout.startswith(f"{run_id}: completed")
    shown = paste(hints(approved)["see it"], here, path)
    assert shown.stdout.startswith(f"run {run_id}  completed")
    # and the rejection of a second parked run, as printed, fails it
    again = sh([str(LANEFLOW), "run", str(CTRL), "approval", "--store", store, "--quiet"], here, path)
    rejected = paste(hints(again)["reject it"], elsewhere, path)
    assert "rejected: failed" in rejected.stdout


def test_a_relative_store_is_carried_as_given_and_works_from_the_same_folder(tmp_path: Path) -> None:
    here, _ = folders(tmp_path)
    path = path_without_this_venv()
    done = sh(
        [sys.executable, "-m", "laneflow.entrypoints.cli", "run", str(CTRL), "approval", "--store", "sqlite:///rel.db"],
        here,
        path,
    )
    assert done.returncode == 0, done.stderr
    said = hints(done)
    run_id = said["see it"].split()[4]
    # `python -m`: the interpreter (its path, as this venv's bin is not on PATH) and the module
    assert said["see it"] == f"{sys.executable} -m laneflow.entrypoints.cli show {run_id} --store sqlite:///rel.db"
    assert said["answer it"].startswith(f"{sys.executable} -m laneflow.entrypoints.cli approve {run_id} --store sqlite:///rel.db")
    paste(said["see it"], here, path)
    record = json.loads(paste(said["answer it"] + " --json", here, path).stdout)
    assert record["status"] == "completed" and (here / "rel.db").is_file()


def test_the_bare_name_when_path_gives_this_very_program(tmp_path: Path) -> None:
    here, elsewhere = folders(tmp_path)
    path = os.pathsep.join([str(LANEFLOW.parent), path_without_this_venv()])
    store = f"sqlite:///{tmp_path / 'bare.db'}"
    done = sh([str(LANEFLOW), "run", str(SEM), "handoff", "--input", '{"things": ["a"]}', "--store", store], here, path)
    assert done.returncode == 0, done.stderr
    see = hints(done)["see it"]
    assert see.startswith("laneflow show run-") and see.endswith(f" --store {store}")
    assert "completed" in paste(see, elsewhere, path).stdout.splitlines()[0]
    # A `laneflow` earlier on PATH that is another program: the hint names this one by its path
    other = tmp_path / "bin"
    other.mkdir()
    (other / "laneflow").write_text("#!/bin/sh\necho another laneflow\n")
    (other / "laneflow").chmod(0o755)
    path = os.pathsep.join([str(other), path])
    parked = sh([str(LANEFLOW), "run", str(CTRL), "approval", "--store", store], here, path)
    said = hints(parked)
    assert said["answer it"].startswith(f"{LANEFLOW} approve run-")
    assert "completed" in paste(said["answer it"], elsewhere, path).stdout.splitlines()[0]
