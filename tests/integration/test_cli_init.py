"""`laneflow init [FOLDER]` makes a workspace to start from (agents, a fan-out, an approval
and a question to a person) whose printed commands run on the stub as printed; `laneflow
examples` lists the bundled examples and `examples copy NAME [FOLDER]` copies one out. A
folder that is not empty is refused, naming it, and nothing is written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import EXAMPLES

from laneflow.entrypoints.cli import main

LANEFLOW = Path(sys.executable).parent / "laneflow"


def printed_commands(out: str, program: str) -> list[list[str]]:
    """The indented command lines a command printed, each as a shell splits it."""
    return [shlex.split(line) for line in out.splitlines() if line.startswith(f"  {program} ")]


def files_of(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_init_makes_a_workspace_whose_printed_commands_run_each_flow_on_the_stub(tmp_path: Path) -> None:
    # Given the script run by its path (not on PATH), in a folder of its own
    env = {**os.environ, "PATH": "/usr/bin:/bin"}

    def laneflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*args], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)

    made = laneflow(str(LANEFLOW), "init", "desk")
    assert made.returncode == 0, made.stderr
    assert "4 agents (planner, publisher, researcher, writer) and 3 flows (approval, ask, fanout)" in made.stdout
    check, approval, ask, fanout = printed_commands(made.stdout, str(LANEFLOW))
    assert check == [str(LANEFLOW), "check", "desk"] and fanout[:4] == [str(LANEFLOW), "run", "desk", "fanout"]
    assert files_of(tmp_path / "desk") == files_of(EXAMPLES / "starter")

    assert laneflow(*check).returncode == 0
    # The fan-out: one researcher step a topic, then the writer
    done = laneflow(*fanout, "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "completed"
    assert [(s["agent"], s["item"]) for s in record["steps"]] == [
        ("researcher", "tides"),
        ("researcher", "kelp"),
        ("researcher", "sea ice"),
        ("writer", None),
    ]
    # The approval: parks, and the printed `approve` continues it to the end
    parked = laneflow(*approval)
    assert parked.returncode == 0 and "is waiting for a person: Publish this draft?" in parked.stderr
    [approve] = [line.split("answer it: ", 1)[1] for line in parked.stderr.splitlines() if "answer it: " in line]
    approved = laneflow(*shlex.split(approve), "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["status"] == "completed"
    # The ask: the planner waits for a person; the printed `answer` (from another process) ends the wait
    asking = subprocess.Popen(ask, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    assert asking.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + 120
    while not any("answer it: " in line for line in said) and time.monotonic() < deadline:
        said.append(asking.stderr.readline())
    assert any("step 0 (planner) asks a person: Which topic should the plan start with?" in line for line in said), said
    [answer] = [line.split("answer it: ", 1)[1].strip() for line in said if "answer it: " in line]
    command = shlex.split(answer)
    assert command[:2] == [str(LANEFLOW), "answer"] and command[3:] == ["0", "YOUR ANSWER"]
    command[-1] = "Start with the tides."
    answered = laneflow(*command)
    assert answered.returncode == 0, answered.stderr
    out, err = asking.communicate(timeout=120)
    assert asking.returncode == 0, err
    assert out.startswith("run-") and ": completed (1 completed)" in out.splitlines()[0]
    shown = laneflow(*shlex.split(out.splitlines()[1].split("see it: ", 1)[1]), "--json")
    [step] = json.loads(shown.stdout)["steps"]
    assert "a person answered: Start with the tides." in [e["text"] for e in step["events"]]


def test_the_workspaces_own_readme_commands_run_from_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["init", str(tmp_path / "desk")]) == 0
    capsys.readouterr()
    readme = (tmp_path / "desk" / "README.md").read_text()
    lines = [line.split("  #")[0].strip() for line in readme.splitlines() if line.startswith("laneflow ")]
    check = next(line for line in lines if line.startswith("laneflow check"))
    fanout = next(line for line in lines if line.startswith("laneflow run . fanout"))
    assert any(line.startswith("laneflow run . approval") for line in lines) and any(
        line.startswith("laneflow run . ask") for line in lines
    )
    monkeypatch.chdir(tmp_path / "desk")
    assert main(shlex.split(check)[1:]) == 0
    assert capsys.readouterr().out == ".: ok\n"
    assert main([*shlex.split(fanout)[1:], "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


def test_init_into_an_empty_folder_and_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["init", str(empty)]) == 0
    assert files_of(empty) == files_of(EXAMPLES / "starter")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    assert "made a workspace in ." in out and "  laneflow run . fanout --input" in out
    assert files_of(here) == files_of(EXAMPLES / "starter")


def test_init_refuses_a_folder_that_is_not_empty_naming_it_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.md").write_text("mine\n")
    assert main(["init", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"laneflow: {taken}: the folder is not empty (notes.md)")
    assert files_of(taken) == ["notes.md"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["init", str(a_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_examples_lists_each_bundled_example_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["examples", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert set(listed) == {p.name for p in EXAMPLES.iterdir() if (p / "flows").is_dir()}
    assert listed["starter"]["flows"] == ["approval", "ask", "fanout"]
    assert listed["starter"]["description"].startswith("A workspace to start from")  # its README's first paragraph
    assert listed["newsroom"]["description"] == "Research topics in parallel, write a brief, check it, publish a post record."
    assert main(["examples"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "FLOWS", "DESCRIPTION"]
    assert any(row.startswith("newsroom") and "Research topics in parallel" in row for row in rows)
    assert rows[-1] == "copy one out (to a new folder named after it, or one you name after it): laneflow examples copy starter"


def test_examples_copy_copies_one_out_and_its_printed_run_line_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["examples", "copy", "newsroom"]) == 0
    out = capsys.readouterr().out
    assert files_of(tmp_path / "newsroom") == files_of(EXAMPLES / "newsroom")
    check, run = printed_commands(out, "laneflow")
    assert check == ["laneflow", "check", "newsroom"]
    assert run == ["laneflow", "run", "newsroom", "brief", "--input", '{"topics": ["tides", "kelp"]}']
    assert main([*run[1:], "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"
    # Again: the folder is there now, so it is refused; another folder is fine
    assert main(["examples", "copy", "newsroom"]) == 2
    assert "newsroom: the folder is not empty" in capsys.readouterr().err
    assert main(["examples", "copy", "newsroom", "second"]) == 0
    assert "copied the newsroom example to second" in capsys.readouterr().out


def test_an_unknown_example_names_the_closest_and_a_mistyped_command_the_closest_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["examples", "copy", "nesroom", str(tmp_path / "x")]) == 2
    assert "no example 'nesroom'; did you mean 'newsroom'?" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as done:
        main(["examples", "cpy", "newsroom"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: laneflow examples ") and "no command 'cpy'; did you mean 'copy'?" in err
