"""bash and the script tools (`StepTools`), under each isolation level this machine has: what
they return, how their own failures come back (is_error), the environment their programs
see, the limits they run under, a stop, and what an escape attempt gets."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Sink, step_job, wait_for

from laneflow.adapters.executors.isolation import BUBBLEWRAP, SUBPROCESS, Isolation, bubblewrap_available, sandbox_uid
from laneflow.adapters.executors.registry import MAX_OUTPUT_CHARS, StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.errors import StepFailed, StepStopped

LEVELS = [
    pytest.param(
        BUBBLEWRAP,
        id="bubblewrap",
        marks=pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap is not installed or cannot make namespaces here"),
    ),
    pytest.param(SUBPROCESS, id="subprocess"),
]

COUNT = '#!/bin/sh\n# Counts the words on stdin\n# and echoes its arguments.\nwc -w\necho "args: $*"\n'


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    scripts = root / "agents" / "worker" / "scripts"
    scripts.mkdir(parents=True)
    (root / "agents" / "worker" / "agent.md").write_text("---\ntools: [bash, scripts]\n---\nYou work.\n")
    (scripts / "count.sh").write_text(COUNT)
    (scripts / "count.sh").chmod(0o755)
    (scripts / "notes.txt").write_text("not executable: not a tool\n")
    (root / "scripts").mkdir()
    (root / "scripts" / "fail-with").write_text('#!/bin/sh\necho "failing with $1" >&2\nexit "$1"\n')
    (root / "scripts" / "fail-with").chmod(0o755)
    for folder in ("storage", "knowledge"):
        (root / folder).mkdir()
    return root


def tools(ws: Path, isolation: Isolation, sink: Sink | None = None, **fields: Any) -> StepTools:
    return StepTools(step_job(ws, **fields), sink or Sink(), isolation=isolation)


# -- what the tools are -------------------------------------------------------------------


def test_scripts_become_script_tools_described_by_their_leading_comments_in_a_stable_order(ws: Path) -> None:
    defs = tools(ws, SUBPROCESS).definitions()
    assert [d["name"] for d in defs] == ["bash", "script_count", "script_fail-with"]
    assert defs[1]["description"].startswith("Counts the words on stdin and echoes its arguments.")
    assert set(defs[1]["input_schema"]["properties"]) == {"args", "stdin"}


def test_tools_script_x_grants_one_script_and_no_bash(ws: Path) -> None:
    assert [d["name"] for d in tools(ws, SUBPROCESS, tools=("script_count", "read_file")).definitions()] == [
        "read_file",
        "script_count",
    ]
    with pytest.raises(ToolError, match="no tool 'bash'"):
        tools(ws, SUBPROCESS, tools=("script_count",)).run("bash", {"command": "true"})


# -- what they return ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation", LEVELS)
def test_bash_returns_the_exit_code_stdout_and_stderr(ws: Path, isolation: Any) -> None:
    out = tools(ws, isolation).run("bash", {"command": "echo out; echo err >&2; pwd"})
    assert out == f"exit code: 0\n--- stdout ---\nout\n{ws}\n\n--- stderr ---\nerr\n"


@pytest.mark.parametrize("isolation", LEVELS)
def test_a_script_gets_its_args_and_stdin(ws: Path, isolation: Any) -> None:
    out = tools(ws, isolation).run("script_count", {"args": ["a", "b c"], "stdin": "one two three"})
    assert "--- stdout ---\n3\nargs: a b c\n" in out and out.startswith("exit code: 0")


@pytest.mark.parametrize("isolation", LEVELS)
def test_output_past_30000_characters_is_cut_and_says_so(ws: Path, isolation: Any) -> None:
    out = tools(ws, isolation).run("bash", {"command": "head -c 100000 /dev/zero | tr '\\0' x"})
    stdout = out.split("--- stdout ---\n")[1].split("\n[stdout cut")[0]
    assert stdout == "x" * MAX_OUTPUT_CHARS
    assert "[stdout cut at 30,000 of 100,000 characters]" in out


@pytest.mark.parametrize("isolation", LEVELS)
def test_a_non_zero_exit_is_a_tool_error_carrying_the_output(ws: Path, isolation: Any) -> None:
    with pytest.raises(ToolError) as failed:
        tools(ws, isolation).run("script_fail-with", {"args": ["7"]})
    assert str(failed.value).startswith("exit code: 7") and "failing with 7" in str(failed.value)


@pytest.mark.parametrize("isolation", LEVELS)
def test_a_call_past_its_time_limit_is_killed_and_is_a_tool_error(ws: Path, isolation: Any) -> None:
    ended = ws / "storage" / "ended"  # what the command's natural end would write
    with pytest.raises(ToolError, match=r"timed out and was killed after 1\.\d s \(the step's timeout of 1 s\)"):
        tools(ws, isolation, timeout=1).run("bash", {"command": f"echo started; sleep 30; touch {ended}"})
    assert not ended.exists(), "the call ran to its end"


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("bash", {}, "non-empty string"),
        ("bash", {"command": 42}, "non-empty string"),
        ("script_count", {"args": "not a list"}, "args must be a list of strings"),
        ("script_count", {"args": [1, 2]}, "args must be a list of strings"),
        ("script_count", {"stdin": ["x"]}, "stdin must be a string"),
        ("bash", ["echo"], "JSON object"),
    ],
)
def test_input_a_tool_does_not_take_is_a_tool_error(ws: Path, name: str, args: Any, says: str) -> None:
    with pytest.raises(ToolError, match=says):
        tools(ws, SUBPROCESS).run(name, args)


def test_a_script_that_cannot_start_is_a_tool_error(ws: Path) -> None:
    (ws / "scripts" / "broken").write_bytes(b"\x7fELF not really")
    (ws / "scripts" / "broken").chmod(0o755)
    with pytest.raises(ToolError, match="script_broken could not start"):
        tools(ws, SUBPROCESS).run("script_broken", {})


# -- the environment, the limits ------------------------------------------------------------


@pytest.mark.parametrize("isolation", LEVELS)
def test_programs_see_only_the_listed_variables_and_the_declared_secrets(
    ws: Path, isolation: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANEFLOW_CANARY", "canary-value-in-laneflows-own-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-must-never-reach-a-script")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-must-never-reach-a-script")
    out = tools(ws, isolation, secret_env={"SEARCH_TOKEN": "tok-12345678"}).run(
        "bash", {"command": "env -0 | sort -z | tr '\\0' '\\n'"}
    )
    stdout = out.split("--- stdout ---\n")[1].split("\n--- stderr ---")[0]
    seen = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    seen.pop("PWD", None), seen.pop("SHLVL", None), seen.pop("_", None)  # bash sets these itself
    assert seen == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(ws),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "TZ": os.environ.get("TZ") or "UTC",
        "LANEFLOW_RUN_ID": "run-1",
        "LANEFLOW_STEP": "2",
        "LANEFLOW_AGENT": "worker",
        "LANEFLOW_WORKSPACE": str(ws),
        "SEARCH_TOKEN": "tok-12345678",
    }
    assert "canary-value" not in out and "sk-ant" not in out and "aws-must" not in out


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize(
    ("size", "cpu", "memory_kib", "processes", "file_kib"),
    [
        ("small", 60, 512 * 1024, 64, 1024**2),
        (None, 300, 2 * 1024**2, 256, 4 * 1024**2),
        ("large", 1800, 8 * 1024**2, 1024, 16 * 1024**2),
    ],
)
def test_size_sets_the_cpu_memory_process_and_file_limits_a_program_runs_under(
    ws: Path, isolation: Any, size: str | None, cpu: int, memory_kib: Any, processes: int, file_kib: Any
) -> None:
    out = tools(ws, isolation, size=size).run("bash", {"command": "ulimit -t; ulimit -v; ulimit -u; ulimit -f"})
    said = out.split("--- stdout ---\n")[1].split("\n")[:4]
    assert said[:2] == [str(cpu), str(memory_kib)] and said[3] == str(file_kib)
    if os.geteuid() == 0:  # the sandbox's own uid: the step's processes alone
        assert said[2] == str(processes)
    else:  # counted beside what this user already runs
        assert int(said[2]) >= processes


@pytest.mark.parametrize("isolation", LEVELS)
def test_a_stop_kills_a_sleeping_script_before_its_end_and_its_children_with_it(ws: Path, isolation: Any, tmp_path: Path) -> None:
    pidfile = ws / "storage" / "child.pid"
    ended = ws / "storage" / "ended"  # what the script's natural end would write
    sink = Sink(stop_after_s=0.3)
    with pytest.raises(StepStopped, match="stopped by a person"):
        tools(ws, isolation, sink).run("bash", {"command": f"sleep 60 & echo $! > {pidfile}; sleep 60; touch {ended}"})
    assert not ended.exists(), "the script ran to its end"
    if isolation is SUBPROCESS:  # under bubblewrap the pid is the namespace's own
        child = int(pidfile.read_text())
        wait_for(lambda: not os.path.exists(f"/proc/{child}") or "Z" in _state(child), "the end of the script's child")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# -- isolation: the trace, network_enforce, escape attempts ------------------------------------


@pytest.mark.parametrize(
    ("isolation", "line"),
    [
        (
            BUBBLEWRAP,
            "isolation: bubblewrap, no network; as nobody in its own user namespace ({host} on the host), no capabilities, no mounts",
        ),
        (SUBPROCESS, "isolation: subprocess, network not enforced, file system not enforced; as {who}"),
    ],
)
def test_the_trace_names_the_isolation_the_step_got_who_its_programs_are_and_the_limits_that_bind_them(
    ws: Path, isolation: Any, line: str
) -> None:
    sink = Sink()
    tools(ws, isolation, sink, size="small").prepare()
    [(_, text, data)] = sink.events
    assert data is not None
    uid = sandbox_uid()
    host = f"uid {uid}" if uid is not None else f"laneflow's own uid {os.geteuid()}"
    who = f"uid {uid}" if uid is not None else f"laneflow's own uid {os.geteuid()}"
    assert text.startswith(line.format(host=host, who=who) + "; limits: ")
    assert "512 MiB of memory and 60 s of CPU a process, 1 GiB a file, a 1 GiB scratch (measured)" in text
    assert ("64 processes, " if uid is not None else "64 processes beside laneflow's own, ") in text
    assert data["limits"] == {
        "processes": 64,
        "memory_bytes": 512 * 1024**2,
        "cpu_s": 60,
        "file_bytes": 1024**3,
        "scratch_bytes": 1024**3,
    }
    assert data["scratch"] == "measured"  # no tmpfs of its own outside a sandbox worker


def test_a_step_without_programs_or_sandbox_names_no_isolation(ws: Path) -> None:
    sink = Sink()
    tools(ws, SUBPROCESS, sink, tools=("read_file",)).prepare()
    assert sink.events == []


def test_network_enforce_fails_the_attempt_where_the_network_cannot_be_enforced(ws: Path) -> None:
    with pytest.raises(StepFailed, match="network_enforce is set") as refused:
        tools(ws, SUBPROCESS, network_enforce=True).prepare()
    assert refused.value.retryable is False
    tools(ws, BUBBLEWRAP, network_enforce=True).prepare()  # enforceable: it goes on


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bool]]]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted: list[bool] = []

    def accept() -> None:
        try:
            server.accept()
            accepted.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()


ESCAPES = {
    "write outside": "echo escaped > {outside}/escaped.txt",
    "read laneflow's environ": "cat /proc/{pid}/environ",
    "rewrite agent.md": "echo 'tools: [everything]' > agents/worker/agent.md",
    "reach the network": "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
    "read the host's home": "test -e {home}",
    "read the password hashes": "grep -q : /etc/shadow",
}


def _attempt(ws: Path, isolation: Isolation, what: str, **values: Any) -> tuple[bool, str]:
    try:
        return True, tools(ws, isolation).run("bash", {"command": ESCAPES[what].format(**values)})
    except ToolError as error:
        return False, str(error)


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap is not installed or cannot make namespaces here")
def test_escape_attempts_fail_under_bubblewrap(
    ws: Path, tmp_path: Path, listener: tuple[int, list[bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANEFLOW_CANARY", "canary-in-laneflows-environ")
    outside = tmp_path / "outside"
    outside.mkdir()
    port, accepted = listener
    agent_md = (ws / "agents" / "worker" / "agent.md").read_text()
    for what in ESCAPES:
        ok, said = _attempt(ws, BUBBLEWRAP, what, outside=outside, pid=os.getpid(), port=port, home=Path.home())
        assert not ok, (what, said)
    assert not (outside / "escaped.txt").exists()
    assert (ws / "agents" / "worker" / "agent.md").read_text() == agent_md
    assert accepted == []


def test_escape_attempts_under_a_plain_subprocess_are_not_fenced_and_its_trace_says_so(
    ws: Path, tmp_path: Path, listener: tuple[int, list[bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the weakest isolation (a plain subprocess), what it cannot fence is recorded as
    # unenforced rather than claimed: the trace says so, and network_enforce would refuse it.
    monkeypatch.setenv("LANEFLOW_CANARY", "canary-in-laneflows-environ")
    outside = tmp_path / "outside"
    outside.mkdir()
    port, _ = listener
    sink = Sink()
    tools(ws, SUBPROCESS, sink).prepare()
    assert sink.events[0][1].startswith("isolation: subprocess, network not enforced, file system not enforced; ")
    traced = sink.events[0][2]
    assert traced is not None and traced["isolation"] == "subprocess" and traced["network_enforced"] is False
    ok, said = _attempt(ws, SUBPROCESS, "reach the network", port=port)
    assert ok and "connected" in said  # not fenced, as the trace says
    wrote, _ = _attempt(ws, SUBPROCESS, "write outside", outside=outside)
    read, said = _attempt(ws, SUBPROCESS, "read laneflow's environ", pid=os.getpid())
    if sandbox_uid() is None:
        # The same user may write wherever laneflow may and read laneflow's own
        # /proc/PID/environ: not fenced either, which is why the trace says so.
        assert wrote and (outside / "escaped.txt").exists()
        assert read and "PATH=" in said
    else:
        # A root laneflow's programs still run as a uid of their own, which owns nothing.
        assert not wrote and not (outside / "escaped.txt").exists()
        assert not read and "canary" not in said
