"""The README's imitation block works exactly as written: its commands are read out of
README.md (so this fails if the README drifts) and run as a person runs them, in a shell, in
a folder where `.venv` and `examples` are the project's: the imitation in the background,
the exports, then `laneflow run ... --model claude-sonnet-4-6`, which must complete."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

README = ROOT / "README.md"

INTRO = "To point anything that speaks the Messages API at the imitation:"


def readme_block() -> list[str]:
    text = README.read_text(encoding="utf-8")
    after = text.split(INTRO, 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block, "the README's imitation block is gone"
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_block_is_what_this_test_runs() -> None:
    imitation, export, run = readme_block()
    assert imitation.startswith(".venv/bin/python -m laneflow_dev.imitation")
    assert export.startswith("export ANTHROPIC_BASE_URL=")
    assert run.startswith(".venv/bin/laneflow run examples/newsroom") and "--model claude-sonnet-4-6" in run


def _end(server: subprocess.Popen[str]) -> None:
    """Ends the imitation's process group, however far it got (a group already gone is not an
    error that should hide the test's own)."""
    for sig, wait_s in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow
def test_the_readme_imitation_block_ends_in_a_completed_run(tmp_path: Path) -> None:
    imitation, export, run = readme_block()
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "LANEFLOW_"))}
    # The README's port, as written, may be taken on a shared machine: the block runs on a
    # free one (`--port 0`), and the export names the address the imitation printed.
    port = re.search(r"--port (\d+)", imitation)
    assert port and port.group(1) in export, (imitation, export)
    server = subprocess.Popen(
        imitation.replace(port.group(0), "--port 0"),
        shell=True,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None
    try:
        said = server.stdout.readline().strip()  # the server says its address once it listens
        assert said.startswith("http://127.0.0.1:"), f"the imitation printed {said!r} (exit {server.poll()})"
        export = re.sub(r"http://127\.0\.0\.1:\d+", said, export)
        done = subprocess.run(f"{export}\n{run}", shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    finally:
        _end(server)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"run-\S+: completed \(5 completed\)", done.stdout), done.stdout
    assert (tmp_path / ".laneflow" / "laneflow.db").exists()
