"""`runs`, `show` and `estimate` as a person sees them: the real command on a terminal (a
pseudo-terminal of 60 and of 120 columns, its width set by COLUMNS or by the terminal
itself) fits it, and every figure of the record is whole in what it prints; piped, `--json`
is the same document whatever the width."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLES, FIXTURES

from laneflow.entrypoints.cli import main

pytestmark = pytest.mark.slow

LANEFLOW = Path(sys.executable).parent / "laneflow"


def on_terminal(args: list[str], width: int, *, columns: bool) -> str:
    """What the command prints on a terminal `width` wide (told by COLUMNS, or by the
    terminal alone), with NO_COLOR so the text is plain."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"NO_COLOR": "1", "TERM": "xterm"}
    if columns:
        env["COLUMNS"] = str(width)
    proc = subprocess.Popen([str(LANEFLOW), *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed with the command
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode().replace("\r\n", "\n")


def whole(figure: str, text: str) -> bool:
    return re.search(rf"(?<![\w.,$]){re.escape(figure)}(?!\w|[.,]\d)", text) is not None


def usd(value: float) -> str:
    return f"{'-' if value < 0 else ''}${abs(value):.4f}"


def figures(record: dict[str, Any]) -> list[str]:
    """Every figure of the run record that `show` prints, as it prints it."""
    found = [record["id"], f"${record['cost_usd']:.4f}", usd(record["savings_usd"])]
    for step in record["steps"]:
        found.append(f"${step['cost_usd']:.4f}")
        found.append(f"{sum(c['tokens']['input'] + c['tokens']['output'] for c in step['calls']):,}")
        for c in step["calls"]:
            found += [str(c["tokens"][k]) for k in ("input", "output", "cache_read", "cache_write")] + [f"{c['ms']}"]
    for lane in record["lanes"]:
        found += [f"{lane['cache_read']:,}", f"{lane['cache_write']:,}", f"{lane['gate_wait_ms'] / 1000:.3f}s"]
        found += [usd(lane["savings_usd"]), usd(lane["gate_savings_usd"])]
    return found


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    store = f"sqlite:///{tmp_path_factory.mktemp('terminal') / 'terminal.db'}"
    done = subprocess.run(
        [
            str(LANEFLOW),
            "run",
            str(FIXTURES / "ws_semantics"),
            "handoff",
            "--input",
            '{"things": ["a", "b", "c"]}',
            "--store",
            store,
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return store, json.loads(done.stdout)


@pytest.mark.parametrize("width, columns", [(60, True), (120, False)])
def test_show_and_runs_fit_the_terminal_with_every_figure_whole(
    ran: tuple[str, dict[str, Any]], width: int, columns: bool
) -> None:
    store, record = ran
    shown = on_terminal(["show", record["id"], "--store", store], width, columns=columns)
    assert [line for line in shown.splitlines() if len(line) > width] == []
    assert [f for f in figures(record) if not whole(f, shown)] == [], shown
    listed = on_terminal(["runs", "--store", store], width, columns=columns)
    assert [line for line in listed.splitlines() if len(line) > width] == []
    assert whole(record["id"], listed) and whole(f"${record['cost_usd']:.4f}", listed), listed


@pytest.mark.parametrize("width, columns", [(60, False), (120, True)])
def test_estimate_fits_the_terminal_with_every_figure_whole(tmp_path: Path, width: int, columns: bool) -> None:
    args = ["estimate", str(EXAMPLES / "newsroom"), "brief", "--input", '{"topics": ["tides", "kelp", "sea ice"]}']
    args += ["--model", "claude-sonnet-4-6", "--store", f"sqlite:///{tmp_path / 'e.db'}"]
    data = json.loads(subprocess.run([str(LANEFLOW), *args, "--json"], capture_output=True, text=True, timeout=120).stdout)
    text = on_terminal(args, width, columns=columns)
    assert [line for line in text.splitlines() if len(line) > width] == []
    wanted = [f"${data['cost_usd'][k]:.4f}" for k in ("expected", "without_gate", "low", "high")]
    for lane in data["lanes"]:
        wanted += [f"{lane['prefix_tokens']:,}", f"${lane['with_gate']['cost_usd']:.4f}"]
        wanted += [f"{lane[g]['cache_write']:,}/{lane[g]['cache_read']:,}" for g in ("with_gate", "without_gate")]
    assert [f for f in wanted if not whole(f, text)] == [], text


def test_json_is_the_same_document_whatever_the_width(
    ran: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, record = ran
    said = []
    for width in ("60", "120"):
        monkeypatch.setenv("COLUMNS", width)
        assert main(["show", record["id"], "--store", store, "--json"]) == 0
        out = capsys.readouterr().out
        assert out.count("\n") == 1  # one line: the document, nothing else
        said.append(json.loads(out))
        assert main(["runs", "--store", store, "--json"]) == 0
        assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [record["id"]]
    assert said[0] == said[1] == {**record, "lanes": said[0]["lanes"]}


def test_following_a_run_that_has_ended_does_not_say_it_goes_on(
    ran: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, record = ran
    assert main(["show", record["id"], "--follow", "--store", store]) == 0
    out = capsys.readouterr().out
    assert "goes on" not in out and "following" not in out and "None" not in out
    assert out.splitlines()[-1].startswith(f"{record['id']}: completed")
    assert f"finished {record['finished_at']}" in out
