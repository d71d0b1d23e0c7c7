"""A program killed for memory fails its attempt for its `size:`, and the next attempt runs one
size up: a stub agent at `size: small` runs a script that holds 700 MiB (more than small's
512 MiB a process, less than medium's 2 GiB), through the definition's sandbox worker on
both stores with laneflow as it runs here (root, where the tests run as root), and through
the step's tools with laneflow a plain user; the record says what happened at each size."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract.store.backends import BACKENDS
from helpers import Sink, as_nobody, data_of, step_job

from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.errors import StepFailed
from laneflow.domain.records import AttemptStatus, FailureKind, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HOLD_MIB = 700  # past small's 512 MiB a process, well inside medium's 2 GiB; held once, then freed

HOG = textwrap.dedent(f"""\
    #!/usr/bin/env python3
    # Holds {HOLD_MIB} MiB, then says so.
    held = bytearray({HOLD_MIB} * 1024 * 1024)
    print("held", len(held) // (1024 * 1024), "MiB")
    """)

AGENT = textwrap.dedent("""\
    ---
    size: small
    tools: [scripts]
    stub: |
      tool: script_hog {}
      ===
      Held.
    ---
    You hold memory.
    """)

# No retries: a memory kill spends none of them (it is not the step's doing, and the sizes bound it).
FLOW = "steps:\n  - agent: hog\n    retries: 0\n    instruction: Hold it.\n"


def workspace(top: Path) -> Path:
    ws = top / "ws-size-up"
    (ws / "agents" / "hog").mkdir(parents=True)
    (ws / "agents" / "hog" / "agent.md").write_text(AGENT)
    (ws / "scripts").mkdir()
    (ws / "scripts" / "hog").write_text(HOG)
    (ws / "scripts" / "hog").chmod(0o755)
    (ws / "flows").mkdir()
    (ws / "flows" / "hold.yaml").write_text(FLOW)
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nRules.\n")
    return ws


@pytest.fixture
def svc(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


def test_a_script_killed_for_memory_at_small_runs_again_at_medium_and_completes_on_both_stores(
    svc: Services, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    run = create_run(svc, ws, "hold", {})
    assert run.options["sandboxed"] == ["hog"]  # a script tool: its steps run in a sandbox worker
    local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.completed, final.error
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert step.status == StepStatus.completed and step.conclusion == "Held."
    first, second = svc.store.list_attempts(run.tenant, run.id, 0)
    # The first attempt failed for its size, not handed back to the model as an is_error result.
    assert first.status == AttemptStatus.failed and first.reason_kind == FailureKind.memory
    assert first.reason is not None
    assert first.reason.startswith("script_hog ran out of memory (MemoryError) at size small (512 MiB a process)"), first.reason
    assert first.reason.endswith("; the next attempt runs at size medium"), first.reason
    assert second.status == AttemptStatus.completed
    # The record says at which size each attempt ran, and why the second one is larger.
    [up] = [e for e in step.events if e.text.startswith("size ")]
    assert up.text == "size medium, up from small after an out-of-memory kill" and up.attempt == 2
    assert data_of(up) == {"size": "medium", "up_from": "small", "why": "out of memory"}
    fences = [e for e in step.events if e.text.startswith("isolation: ")]
    assert [e.attempt or 1 for e in fences] == [1, 2]
    assert "512 MiB of memory" in fences[0].text and "2 GiB of memory" in fences[1].text
    assert [data_of(e)["limits"]["memory_bytes"] for e in fences] == [512 * 1024**2, 2 * 1024**3]
    # The second attempt's call held what the first could not, and was the model's to read.
    calls = [e for e in step.events if e.type == "tool"]
    assert [e.attempt or 1 for e in calls] == [2], calls
    capture = json.loads((tmp_path / "captures" / data_of(calls[0])["capture"]).read_text())
    assert f"held {HOLD_MIB} MiB" in capture["output"]
    # And it was told why it runs again.
    [told] = [e for e in step.events if e.type == "attempt"]
    assert data_of(told)["kinds"] == ["memory"]


def test_at_large_a_memory_kill_fails_the_attempt_for_good(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    tools = StepTools(step_job(ws, agent="hog", agent_path="agents/hog", tools=("bash",), size="large"), Sink())
    with pytest.raises(StepFailed) as raised:  # no larger size: another attempt would be killed the same way
        tools.run("bash", {"command": "python3 -c 'raise MemoryError'"})
    assert not raised.value.retryable and raised.value.kind == FailureKind.other
    assert raised.value.reason == "bash ran out of memory (MemoryError) at size large (8 GiB a process), the largest size"
    with pytest.raises(ToolError):  # a program's own failure is still the model's to read
        tools.run("bash", {"command": "echo no such thing >&2; exit 3"})


# -- laneflow a plain user ---------------------------------------------------------------------


def hold_at(ws: Path, size: str) -> dict[str, Any]:
    """One call of the script through the step's tools at `size`: what came of it."""
    tools = StepTools(step_job(ws, agent="hog", agent_path="agents/hog", tools=("scripts",), size=size), Sink())
    try:
        return {"said": tools.run("script_hog", {})}
    except StepFailed as failed:
        return {"failed": failed.reason, "retryable": failed.retryable, "kind": str(failed.kind)}


def hold_both(ws: Path) -> dict[str, Any]:
    return {"uid": os.geteuid(), "small": hold_at(ws, "small"), "medium": hold_at(ws, "medium")}


def as_a_plain_user(top: Path) -> dict[str, Any]:
    """`hold_at` small and medium in a laneflow that is nobody, in a workspace it owns."""
    seen: dict[str, Any] = as_nobody(top, lambda: hold_both(workspace(top)), "the plain user's calls")
    return seen


def test_as_a_plain_user_the_script_is_killed_for_memory_at_small_and_holds_at_medium(tmp_path: Path) -> None:
    if os.geteuid() != 0:  # this process is the plain user
        seen = hold_both(workspace(tmp_path))
    else:
        top = Path(tempfile.mkdtemp(prefix="laneflow-size-up-"))  # pytest's own folder is root's alone
        try:
            seen = as_a_plain_user(top)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    assert seen["uid"] != 0
    small, medium = seen["small"], seen["medium"]
    assert small.get("retryable") is True and small["kind"] == "memory", small
    assert small["failed"].startswith("script_hog ran out of memory (MemoryError) at size small (512 MiB a process)"), small
    assert f"held {HOLD_MIB} MiB" in medium["said"], medium
