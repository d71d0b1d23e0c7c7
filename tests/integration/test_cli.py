"""The `laneflow` command as a person uses it: exit codes, one clear line for bad input,
nothing written for a refused run, machine-clean `--json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLES, FIXTURES, ROOT

from laneflow.entrypoints.cli import main

SEM = FIXTURES / "ws_semantics"


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def runs_in(store: str, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    assert main(["runs", "--store", store, "--json"]) == 0
    answer: list[Any] = json.loads(capsys.readouterr().out)
    return answer


def test_run_json_prints_only_the_record_and_exits_0(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(SEM), "handoff", "--input", '{"things": ["a"]}', "--store", store, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads(out)  # the whole of stdout is one JSON document
    assert record["status"] == "completed" and record["flow"] == "handoff"
    for key in (
        "id",
        "tenant",
        "workspace",
        "stop_requested",
        "created_at",
        "driven_at",
        "finished_at",
        "parked_at",
        "revision",
        "cost_usd",
        "drives",
        "steps",
    ):
        assert key in record
    step = record["steps"][0]
    for key in (
        "index",
        "group",
        "agent",
        "item",
        "model",
        "status",
        "attempts",
        "cycle",
        "instruction",
        "result",
        "conclusion",
        "data",
        "rescue_of",
        "skip_reason",
        "cost_usd",
        "events",
        "calls",
        "prompt_layers",
    ):
        assert key in step
    assert set(step["calls"][0]["tokens"]) == {"input", "output", "cache_read", "cache_write", "cache_write_1h"}


def test_a_failed_run_exits_1_with_the_reason_on_stderr(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(SEM), "required_fails", "--store", store, "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    assert "failed: step 0 (failer) failed: cannot do this" in captured.err


def test_a_missing_workspace_exits_2_naming_it(store: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    code = main(["run", str(missing), "brief", "--store", store])
    err = capsys.readouterr().err
    assert code == 2 and "nowhere" in err.splitlines()[0]


def test_an_invalid_flow_exits_2_lists_every_problem_and_writes_nothing(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(FIXTURES / "ws_broken"), "messy", "--store", store])
    err = capsys.readouterr().err
    assert code == 2
    assert "flows/messy.yaml" in err and len([line for line in err.splitlines() if "messy.yaml:" in line]) >= 5
    assert runs_in(store, capsys) == []


def test_an_input_that_does_not_match_the_schema_exits_2_naming_the_field(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(SEM), "handoff", "--input", '{"things": [1]}', "--store", store])
    err = capsys.readouterr().err
    assert code == 2 and "things" in err
    assert runs_in(store, capsys) == []


@pytest.mark.parametrize("given, expected", [("{not json", "--input: not valid JSON"), ("@/no/such/file.json", "cannot read it")])
def test_bad_input_flag_exits_2_with_one_clear_line(
    store: str, capsys: pytest.CaptureFixture[str], given: str, expected: str
) -> None:
    code = main(["run", str(SEM), "handoff", "--input", given, "--store", store])
    err = capsys.readouterr().err
    assert code == 2 and expected in err.splitlines()[0]


def test_input_from_a_file(store: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"things": ["from-file"]}')
    assert main(["run", str(SEM), "handoff", "--input", f"@{path}", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][0]["item"] == "from-file"


def test_check_lists_every_problem_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", str(FIXTURES / "ws_broken")])
    out = capsys.readouterr().out
    assert code == 2
    assert "agents/broken/agent.md:4" in out
    assert len([line for line in out.splitlines() if line.startswith("flows/messy.yaml")]) >= 5


def test_check_a_clean_workspace_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLES / "newsroom")]) == 0
    assert "ok" in capsys.readouterr().out


def test_show_and_runs_read_what_run_wrote(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", str(SEM), "handoff", "--input", '{"things": ["a"]}', "--store", store, "--json"])
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert [r["id"] for r in runs_in(store, capsys)] == [run_id]
    assert main(["show", run_id, "--store", store]) == 0
    text = capsys.readouterr().out
    assert run_id in text and "layers:" in text
    assert main(["show", run_id, "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == run_id


def test_show_an_unknown_run_exits_2(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "run-nope", "--store", store]) == 2
    assert "run-nope" in capsys.readouterr().err


@pytest.mark.slow
def test_the_console_script_runs_the_demo_with_progress_on_stderr_only(tmp_path: Path) -> None:
    """The installed `laneflow demo` as a person runs it (a real process)."""
    exe = Path(sys.executable).parent / "laneflow"
    proc = subprocess.run(
        [str(exe), "demo", "--json", "--store", f"sqlite:///{tmp_path / 'demo.db'}"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "LANEFLOW_HOME": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "completed" and len(record["steps"]) == 8
    assert "group 0 step 0 researcher (tides): completed" in proc.stderr


@pytest.mark.slow
def test_ctrl_c_on_a_running_run_leaves_nothing_running_and_the_run_resumable(tmp_path: Path) -> None:
    """A person interrupts `laneflow run`: no step stays running, the run is not failed but
    left for `laneflow resume` (tests/integration/test_interrupt.py resumes it)."""
    import signal
    import time

    store = f"sqlite:///{tmp_path / 'int.db'}"
    exe = Path(sys.executable).parent / "laneflow"
    proc = subprocess.Popen(
        [str(exe), "run", str(SEM), "parallel", "--store", store, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    from laneflow.adapters.store import open_store

    db = open_store(store)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until a step is really running
        runs = db.list_runs("local") if (tmp_path / "int.db").exists() else []
        if runs and any(s.status == "running" for s in db.get_steps("local", runs[0].id)):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run = db.get_run("local", db.list_runs("local")[0].id)
    assert run.status == "running" and run.error is None and f"laneflow resume {run.id}" in err
    assert all(s.status != "running" for s in run.steps)
    assert all(a.status != "running" for a in db.list_attempts("local", run.id))


def test_the_demo_on_the_messages_api_imitation_shows_cache_reads(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`laneflow demo --imitate`: Claude's executor through the SDK against the local
    imitation; the lead writes the prefix once, every researcher sibling reads it."""
    assert main(["demo", "--imitate", "--json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "completed"
    researchers = [s for s in record["steps"] if s["agent"] == "researcher"]
    assert all(s["model"] == "claude-sonnet-4-6" for s in researchers)
    assert researchers[0]["calls"][0]["tokens"]["cache_write"] > 2048
    assert all(s["calls"][0]["tokens"]["cache_read"] > 2048 for s in researchers[1:])
    assert record["steps"][-1]["data"]["slug"] == "ocean-records"
    assert main(["show", record["id"], "--store", store]) == 0
    assert "tokens read, 0 written" in capsys.readouterr().out


def test_the_sandbox_demo_runs_the_tides_script_with_its_secret_on_a_copy_of_the_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`laneflow demo tides`: each step runs in a sandbox worker, its script gets the
    declared secret from the example's .secrets.env, and what it files is kept in a fresh
    copy of the example beside the store, never in the project's examples/."""
    from laneflow.paths import project_root

    example = project_root() / "examples" / "tides"
    before = sorted(p.relative_to(example).as_posix() for p in example.rglob("*"))
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    assert main(["demo", "tides", "--json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "completed" and [s["status"] for s in record["steps"]] == ["completed"] * 3
    for step in record["steps"]:
        said = [e["text"] for e in step["events"]]
        assert any(t.startswith("sandbox worker:") for t in said), said
        assert any(t.startswith("isolation: ") for t in said), said
        assert "secrets from the workspace's .secrets.env: TIDES_TOKEN" in said
    copy = tmp_path / "demo-workspaces" / "tides"
    assert sorted(p.name for p in (copy / "storage").glob("tides-*.md")) == [
        "tides-brest.md",
        "tides-dover.md",
        "tides-saint-malo.md",
    ]
    assert (copy / "state" / "tables-filed").read_text().strip() == "3"
    assert sorted(p.relative_to(example).as_posix() for p in example.rglob("*")) == before  # the example is untouched
    assert main(["demo", "tides", "--imitate", "--store", store]) == 2  # its steps are scripted for the stub only


def test_the_reach_demo_delegates_searches_and_asks_an_mcp_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`laneflow demo almanac`: each editor step delegates to the researcher (its turns are
    spans of the step), whose search of the knowledge and MCP tide table answer for real;
    the researchers' delegations share one warm prefix."""
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    assert main(["demo", "almanac", "--json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "completed" and [s["status"] for s in record["steps"]] == ["completed"] * 3
    researcher_writes = 0
    for step in record["steps"]:
        tools = {e["data"]["tool"]: e["data"] for e in step["events"] if e["type"] == "tool"}
        assert set(tools) == {"delegate", "search", "mcp__tides__high_water"}, tools
        assert not any(data.get("is_error") for data in tools.values()), tools
        assert tools["mcp__tides__high_water"]["delegate"] == "researcher"
        spans = [c for c in step["calls"] if c.get("delegate") == "researcher"]
        researcher_writes += sum(1 for c in spans if c["tokens"]["cache_write"])
    assert researcher_writes == 1  # one cold researcher prefix for the three delegations


CTRL = FIXTURES / "ws_control"


def _laneflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "laneflow"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.slow
def test_stop_from_a_second_terminal_ends_a_running_run(tmp_path: Path) -> None:
    """One process runs a slow flow; a second `laneflow stop` ends it; a third says so."""
    import time

    store = f"sqlite:///{tmp_path / 'stop.db'}"
    exe = Path(sys.executable).parent / "laneflow"
    runner = subprocess.Popen(
        [str(exe), "run", str(CTRL), "stop", "--store", store, "--quiet", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    from laneflow.adapters.store import open_store

    db = open_store(store)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = db.list_runs("local") if (tmp_path / "stop.db").exists() else []
        if runs and db.get_steps("local", runs[0].id)[0].status == "running":
            break
        time.sleep(0.05)
    run_id = db.list_runs("local")[0].id
    first = _laneflow("stop", run_id, "--store", store, cwd=tmp_path)
    again = _laneflow("stop", run_id, "--store", store, cwd=tmp_path)
    out, err = runner.communicate(timeout=60)
    assert first.returncode == 0 and "stop requested" in first.stdout
    assert again.returncode == 0 and "already stopped" in again.stdout
    assert runner.returncode == 1 and "stopped by a person" in err
    record = json.loads(out)
    assert record["status"] == "failed" and record["stop_requested"] and record["finished_at"]
    assert [s["status"] for s in record["steps"]] == ["failed", "skipped"]
    after = _laneflow("stop", run_id, "--store", store, cwd=tmp_path)
    assert after.stdout.strip() == f"run {run_id} already stopped (failed)"


@pytest.mark.slow
def test_approve_from_a_second_terminal_continues_a_parked_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'approve.db'}"
    parked = _laneflow("run", str(CTRL), "approval", "--store", store, "--json", cwd=tmp_path)
    assert parked.returncode == 0 and "waiting for a person: Publish this draft?" in parked.stderr
    run_id = json.loads(parked.stdout)["id"]
    shown = _laneflow("show", run_id, "--store", store, cwd=tmp_path)
    assert "awaiting-approval" in shown.stdout
    approved = _laneflow("approve", run_id, "--store", store, "--json", cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    record = json.loads(approved.stdout)
    assert record["status"] == "completed" and record["drives"] == 2
    again = _laneflow("approve", run_id, "--store", store, cwd=tmp_path)
    assert again.returncode == 2 and "not waiting for an approval (it is completed)" in again.stderr


@pytest.mark.slow
def test_reject_from_a_second_terminal_fails_the_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'reject.db'}"
    run_id = json.loads(_laneflow("run", str(CTRL), "approval", "--store", store, "--json", cwd=tmp_path).stdout)["id"]
    rejected = _laneflow("approve", run_id, "--reject", "--store", store, cwd=tmp_path)
    assert rejected.returncode == 0 and "rejected" in rejected.stdout
    record = json.loads(_laneflow("show", run_id, "--store", store, "--json", cwd=tmp_path).stdout)
    assert record["status"] == "failed" and record["error"] == "rejected by a person"


@pytest.mark.slow
def test_a_dynamodb_store_behind_the_local_engine_really_persists(tmp_path: Path) -> None:
    """`laneflow init-store` and `laneflow run --store dynamodb://...` in processes of their
    own, against a DynamoDB endpoint (moto's server): the run is there for a fresh reader,
    so nothing the engine does intercepts the store's calls."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        store = "dynamodb://cli-runs?bucket=cli-blobs"
        exe = str(Path(sys.executable).parent / "laneflow")
        made = subprocess.run(
            [exe, "init-store", "--store", store], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
        )
        assert made.returncode == 0 and "created from template.yaml" in made.stdout, made.stderr
        ran = subprocess.run(
            [exe, "run", str(SEM), "handoff", "--input", '{"things": ["a", "b"]}', "--store", store, "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=tmp_path,
        )
        assert ran.returncode == 0, ran.stderr
        run_id = json.loads(ran.stdout)["id"]
        import boto3

        client = boto3.client(
            "dynamodb",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        assert "cli-runs" in client.list_tables()["TableNames"]
        shown = subprocess.run(
            [exe, "show", run_id, "--store", store, "--json"], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
        )
        record = json.loads(shown.stdout)
        assert record["status"] == "completed" and [s["status"] for s in record["steps"]] == ["completed"] * 5
        assert not (tmp_path / ".laneflow" / "laneflow.db").exists()  # nothing went to the default SQLite store
    finally:
        server.stop()
