"""What a step reads, on the embedded engine: each attempt reads its workspace and agent afresh,
so an edit between two steps of one run is what the second step uses (the parse of a file
is reused only for the very same bytes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from helpers import FlowRunner

from laneflow.domain.records import RunStatus
from laneflow.ports import ExecutionSink, Services, StepJob, StepOutcome

AGENT = '---\nstub: "Answer {n}."\n---\nYou answer.\n'


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "agents" / "worker").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nShared.\n")
    (ws / "agents" / "worker" / "agent.md").write_text(AGENT.replace("{n}", "one"))
    (ws / "flows" / "two.yaml").write_text(
        "description: two groups\nsteps:\n  - agent: worker\n    instruction: first\n  - agent: worker\n    instruction: second\n"
    )
    return ws


class EditsAfterFirstStep:
    """The stub executor, editing agent.md once its first step has run: the same size and
    the same modification time, so only its bytes tell the edit."""

    def __init__(self, inner: Any, md: Path) -> None:
        self.inner, self.md, self.edited = inner, md, False

    def execute(self, job: StepJob, sink: ExecutionSink) -> StepOutcome:
        outcome = self.inner.execute(job, sink)
        if not self.edited:
            before = self.md.stat()
            self.md.write_text(AGENT.replace("{n}", "two"))
            os.utime(self.md, ns=(before.st_atime_ns, before.st_mtime_ns))
            self.edited = True
        answer: StepOutcome = outcome
        return answer


def test_an_edit_of_agent_md_between_two_steps_is_what_the_second_step_uses(
    svc: Services, run_flow: FlowRunner, tmp_path: Path
) -> None:
    ws = _workspace(tmp_path)
    svc.executors["stub"] = EditsAfterFirstStep(svc.executor("stub"), ws / "agents" / "worker" / "agent.md")  # type: ignore[assignment]
    run = run_flow(ws, "two", {}).run
    assert run.status == RunStatus.completed
    assert [s.result for s in run.steps] == ["Answer one.", "Answer two."]
