"""A step asks a person (`tools: [ask]`), on both stores and through the real definition on
the embedded engine: an answer given from another process (`laneflow answer`) reaches the
step, an unanswered question times out and the step goes on, and a stop during the wait
ends the step at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, stderr_of, write_workspace
from pydantic import SecretStr

from laneflow.domain.inbox import QuestionStatus
from laneflow.domain.records import EventType, Run, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.usecases.answer import NoQuestionWaiting, answer_question, waiting_questions
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import local_engine

ASK = 'tool: ask {"question": "Which coast first, north or south?"}'
LANEFLOW = Path(sys.executable).parent / "laneflow"


def ask_workspace(root: Path, *, ask_timeout: float = 60, stub: str = f"{ASK}\nAsked.\n===\nDone.") -> Path:
    agents = {"asker": {"tools": ["ask"], "ask_timeout": ask_timeout, "stub": stub}}
    return write_workspace(root / "ws", agents, {"desk": {"description": "one asker", "steps": [{"agent": "asker"}]}})


def start(svc: Services, ws: Path) -> tuple[Run, threading.Thread, list[Any]]:
    """The run, and the thread driving it (the ask blocks its step)."""
    run = create_run(svc, ws, "desk")
    done: list[Any] = []
    thread = threading.Thread(
        target=lambda: done.append(local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run), daemon=True
    )
    thread.start()
    return run, thread, done


def until_asked(svc: Services, run: Run, timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = waiting_questions(svc, run.tenant, run_id=run.id)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the step never asked")


def tool_output(tmp_path: Path, tool: str) -> str:
    said = [json.loads(p.read_text()) for p in sorted((tmp_path / "captures").rglob("*.json"))]
    answer: str = next(c["output"] for c in said if c["tool"] == tool)
    return answer


@pytest.mark.slow
def test_an_ask_answered_from_another_process_reaches_the_step(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run, thread, done = start(svc, ask_workspace(tmp_path))
    waiting = until_asked(svc, run)
    assert waiting.index == 0 and waiting.question == "Which coast first, north or south?"
    listed = subprocess.run(
        [str(LANEFLOW), "runs", "--store", svc.store.url], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[-1] == "ASKING" and row.startswith(run.id) and row.endswith("step 0")
    answered = subprocess.run(
        [str(LANEFLOW), "answer", run.id, "0", "The north, then the south.", "--store", svc.store.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert answered.returncode == 0, answered.stderr
    thread.join(60)
    [ended] = done
    assert ended.status == RunStatus.completed, ended.error
    [step] = ended.steps
    asks = [e.text for e in step.events if e.type == EventType.ask]
    assert asks[0].startswith("asked a person: Which coast first") and "a person answered: The north, then the south." in asks
    assert "answered by a person" in asks
    assert tool_output(tmp_path, "ask") == "The north, then the south."
    [question] = svc.store.get_inbox(run.tenant, run.id, 0)
    assert question.status == QuestionStatus.answered and waiting_questions(svc, run.tenant) == []
    assert svc.store.get_observed(run.tenant, run.id, 0) == {1: [question.delivery_id]}
    # Answered once: a second answer is refused, naming why.
    with pytest.raises(NoQuestionWaiting, match="answered"):
        answer_question(svc, run.tenant, run.id, 0, "again")
    again = subprocess.run(
        [str(LANEFLOW), "answer", run.id, "0", "again", "--store", svc.store.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert again.returncode == 2 and "waiting on no question" in again.stderr


def test_an_unanswered_ask_times_out_and_the_step_completes(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run, thread, done = start(svc, ask_workspace(tmp_path, ask_timeout=1))
    thread.join(60)
    [ended] = done
    assert ended.status == RunStatus.completed, ended.error
    [step] = ended.steps
    assert step.status == StepStatus.completed and step.conclusion == "Done."
    assert "no answer within 1 s; the step goes on" in [e.text for e in step.events if e.type == EventType.ask]
    assert tool_output(tmp_path, "ask").startswith("no answer within 1 s")
    [question] = svc.store.get_inbox(run.tenant, run.id, 0)
    assert question.status == QuestionStatus.expired
    with pytest.raises(NoQuestionWaiting, match="expired"):
        answer_question(svc, run.tenant, run.id, 0, "too late")


def test_a_stop_during_an_ask_ends_the_step_at_once(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    run, thread, done = start(svc, ask_workspace(tmp_path, ask_timeout=600))
    until_asked(svc, run)
    stop_run(svc, run.tenant, run.id)
    thread.join(60)  # the ask waits 600 s: ended within this bound, the stop ended it
    assert not thread.is_alive(), "the stop did not end the wait for an answer"
    [ended] = done
    assert ended.status == RunStatus.failed and ended.stop_requested
    [step] = ended.steps
    assert step.status == StepStatus.failed and "waited for an answer" in (step.error or "")
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    assert attempt.status == "stopped"
    [question] = svc.store.get_inbox(run.tenant, run.id, 0)
    assert question.status == QuestionStatus.expired and waiting_questions(svc, run.tenant) == []


def test_an_ask_never_waits_past_the_steps_own_timeout(svc: Services, tmp_path: Path) -> None:
    ws = ask_workspace(tmp_path, ask_timeout=600)
    md = ws / "agents" / "asker" / "agent.md"
    md.write_text(md.read_text().replace("tools:", "timeout: 2\ntools:", 1))
    run, thread, done = start(svc, ws)
    thread.join(60)
    [ended] = done
    [step] = ended.steps
    asked = next(e for e in step.events if e.type == EventType.ask)
    assert 0 < asked.data["wait_s"] <= 2


def test_on_claude_the_answer_is_the_ask_tools_result(tmp_path: Path) -> None:
    """The Claude executor, through the real SDK, against the Messages API imitation: the
    person's answer comes back to the model as the ask tool's result."""
    from laneflow.adapters.executors.anthropic import AnthropicExecutor
    from laneflow.adapters.store import open_store
    from laneflow.settings import Settings
    from laneflow.wiring import for_store
    from laneflow_dev.imitation import MessagesImitation, Reply

    key = "sk-test-0123456789abcdef"
    bodies: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> Reply:
        bodies.append(body)
        if not any(m["role"] == "assistant" for m in body["messages"]):
            return Reply(text="Asking.", tool_uses=[{"name": "ask", "input": {"question": "North or south?"}}])
        return Reply(text="Going north.")

    ws = write_workspace(
        tmp_path / "ws",
        {"asker": {"tools": ["ask"], "ask_timeout": 60}},
        {"desk": {"description": "one asker", "steps": [{"agent": "asker"}]}},
        agents_md="model: claude-sonnet-4-6\n",
    )
    with MessagesImitation(api_keys={key}, responder=respond) as api:
        settings = Settings(anthropic_api_key=SecretStr(key), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=api.url, backoff_s=0.01)
        run, thread, done = start(svc, ws)
        until_asked(svc, run)
        answer_question(svc, run.tenant, run.id, 0, "North.")
        thread.join(60)
    [ended] = done
    assert ended.status == RunStatus.completed, ended.error
    [result] = [b for b in bodies[-1]["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert result["content"] == "North." and result["is_error"] is False
    assert [t["name"] for t in bodies[0]["tools"]] == ["ask"]
    assert "Asking a person" in bodies[0]["system"][0]["text"]  # the ask layer: stable, in the cached block


@pytest.mark.slow
def test_a_question_whose_worker_died_expires_when_reconcile_interrupts_its_attempt(tmp_path: Path) -> None:
    """A `laneflow run` killed while its step waits on a person: reconcile marks the attempt
    interrupted, and its question stops being offered to people."""
    import signal

    from laneflow.adapters.store import open_store
    from laneflow.settings import Settings
    from laneflow.wiring import for_store

    ws = ask_workspace(tmp_path, ask_timeout=600)
    url = f"sqlite:///{tmp_path / 'ask.db'}"
    proc = subprocess.Popen(
        [str(LANEFLOW), "run", str(ws), "desk", "--store", url, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    svc = None
    deadline = time.monotonic() + 60
    waiting: list[Any] = []
    while time.monotonic() < deadline and not waiting and proc.poll() is None:
        if (tmp_path / "ask.db").exists():
            svc = svc or for_store(open_store(url), Settings(capture_dir=str(tmp_path / "captures")))
            waiting = waiting_questions(svc, "local")
        time.sleep(0.05)
    assert waiting and svc, stderr_of(proc) if proc.poll() is not None else "never asked"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # Reconcile interrupts the attempt and re-drives the run: its second attempt asks anew.
    reconciling = subprocess.Popen(
        [str(LANEFLOW), "reconcile", "--store", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    run_id = waiting[0].run_id
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and reconciling.poll() is None:
        again = waiting_questions(svc, "local")
        if again and again[0].id != waiting[0].id:
            break
        time.sleep(0.05)
    first, second = svc.store.get_inbox("local", run_id, 0)
    assert first.status == QuestionStatus.expired and first.attempt == 1
    assert second.status == QuestionStatus.open and second.attempt == 2
    assert [q.id for q in waiting_questions(svc, "local")] == [second.id]
    answered = subprocess.run(
        [str(LANEFLOW), "answer", run_id, "0", "North.", "--store", url], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert answered.returncode == 0, answered.stderr
    _, err = reconciling.communicate(timeout=120)
    assert reconciling.returncode == 0, err
    run = svc.store.get_run("local", run_id)
    assert run.status == RunStatus.completed and run.steps[0].attempts == 2
    assert svc.store.list_open_questions("local") == []
