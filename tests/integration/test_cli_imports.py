"""What each command of the CLI imports, in a process of its own: `show` and `runs` on an
SQLite store load no engine, no AWS SDK, no model SDK and no MCP client; a command loads its
own module and no other command's; Powertools makes no tracer (and imports no X-Ray SDK) outside Lambda; a step
whose agent has no MCP server never imports the MCP SDK. The figures these buy are in
bench/startup.py; here, only what was imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, write_workspace

from laneflow.adapters.store import open_store
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store

# Never needed to read an SQLite store and print what it holds.
NOT_FOR_LOOKING = (
    "moto",
    "boto3",
    "botocore",
    "anthropic",
    "mcp",
    "aws_xray_sdk",
    "laneflow.adapters.engine.local",
    "laneflow.entrypoints.cli_drive",
)

# `laneflow ARGS` in-process of a fresh interpreter, then what it imported (on stderr's last line).
PROBE = """
import json, sys
from laneflow.entrypoints.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _probe(*args: str, code: str = PROBE, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
    )
    assert done.stderr.strip(), done
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted({n for n in names for m in modules if m == n or m.startswith(f"{n}.")})


@pytest.fixture
def queued_run(tmp_path: Path) -> tuple[str, str]:
    """An SQLite store holding one run (queued: nothing drove it) and the store's URL."""
    ws = write_workspace(
        tmp_path / "ws", {"writer": {"stub": "done"}}, {"one": {"steps": [{"agent": "writer", "instruction": "Go."}]}}
    )
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    svc = for_store(open_store(url), Settings(capture_dir=str(tmp_path / "captures")))
    return url, create_run(svc, ws, "one", {}).id


@pytest.mark.parametrize("command", [["show", "RUN"], ["show", "RUN", "--json"], ["runs"], ["runs", "--json"]])
def test_show_and_runs_on_sqlite_import_no_engine_no_aws_or_model_sdk_and_no_mcp(
    queued_run: tuple[str, str], command: list[str]
) -> None:
    url, run_id = queued_run
    seen, out = _probe(*[run_id if word == "RUN" else word for word in command], "--store", url)
    assert seen["code"] == 0 and run_id in out  # it did show the run
    assert _loaded(seen["modules"], NOT_FOR_LOOKING) == []
    assert "laneflow.adapters.store.sqlite" in seen["modules"]  # what it does need, it has


def test_the_probe_sees_a_command_that_loads_the_engine(queued_run: tuple[str, str]) -> None:
    url, run_id = queued_run
    seen, _ = _probe("resume", run_id, "--store", url, "--quiet", "--step-workers", "0")
    assert seen["code"] == 0
    assert {"moto", "laneflow.adapters.engine.local", "laneflow.entrypoints.cli_drive"} <= set(
        _loaded(seen["modules"], NOT_FOR_LOOKING)
    )


def test_a_command_loads_its_own_module_and_no_other_command_s() -> None:
    seen, out = _probe(code=PROBE.replace("main(sys.argv[1:])", "main(['examples', '--json'])"))
    assert seen["code"] == 0 and json.loads(out)  # a command that runs loads its own module only
    modules = seen["modules"]
    assert "laneflow.entrypoints.cli_examples" in modules
    assert [
        m
        for m in ("laneflow.entrypoints.cli_drive", "laneflow.entrypoints.cli_inspect", "laneflow.entrypoints.cli_control")
        if m in modules
    ] == []


POWERTOOLS = """
import json, sys
from laneflow.adapters.aws import powertools
print(json.dumps({"code": 0, "tracer": type(powertools.tracer).__name__, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_powertools_makes_no_tracer_outside_lambda_and_one_in_it() -> None:
    import os

    local, _ = _probe(code=POWERTOOLS, env={k: v for k, v in os.environ.items() if k != "AWS_LAMBDA_FUNCTION_NAME"})
    assert local["tracer"] == "NoneType" and _loaded(local["modules"], ("aws_xray_sdk",)) == []
    in_lambda, _ = _probe(code=POWERTOOLS, env={**os.environ, "AWS_LAMBDA_FUNCTION_NAME": "RunStepFunction"})
    assert in_lambda["tracer"] == "Tracer" and _loaded(in_lambda["modules"], ("aws_xray_sdk",)) == ["aws_xray_sdk"]


TOOLS = """
import json, sys
from pathlib import Path
from helpers import step_job
from laneflow.adapters.executors.registry import StepTools, tool_definitions
job = step_job(Path(sys.argv[1]), tools=("read_file",))
names = [d["name"] for d in tool_definitions(job)]
print(json.dumps({"code": 0, "names": names, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_a_step_with_no_mcp_server_never_imports_the_mcp_sdk(tmp_path: Path) -> None:
    import os

    ws = write_workspace(
        tmp_path / "ws", {"writer": {"stub": "done"}}, {"one": {"steps": [{"agent": "writer", "instruction": "Go."}]}}
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    seen, _ = _probe(str(ws), code=TOOLS, env=env)
    assert seen["names"] == ["read_file"]
    assert _loaded(seen["modules"], ("mcp", "mcp_types", "httpx2", "anyio")) == []
