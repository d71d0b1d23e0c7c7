"""Colleagues of a group talk while they work (`tools: [peers]`), on both stores and through
the real definition on the embedded engine: a message reaches a listener that is still
working between its turns, both records show it, a message to a colleague that has ended is
refused, messages are masked like every record, and delivery is exactly-once per step across
an interrupted attempt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ServicesOn, data_of, drive, stderr_of, stored_bytes, write_workspace
from pydantic import SecretStr

from laneflow.domain.records import EventType, RunStatus, Step, StepStatus
from laneflow.ports import Services

TALK = 'tool: peers_message {"to": "listener", "text": "I already covered the tides; take the currents"}'


def peers_workspace(root: Path, *, talker: str, listener: str | list[str], **extra_agents: dict[str, Any]) -> Path:
    agents: dict[str, dict[str, Any]] = {
        "talker": {"tools": ["peers"], "stub": talker},
        "listener": {"tools": ["peers"], "stub": listener},
        **extra_agents,
    }
    flow = {"description": "two colleagues", "steps": [{"group": [{"agent": "talker"}, {"agent": "listener"}]}]}
    return write_workspace(root / "ws", agents, {"desk": flow})


def peer_events(step: Step) -> list[str]:
    return [e.text for e in step.events if e.type == EventType.peer]


@pytest.mark.slow
def test_a_talker_messages_a_working_listener_whose_next_turn_carries_it(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    ws = peers_workspace(
        tmp_path,
        # The talker speaks 500 ms in, while the listener's 2 s first turn runs: at once, its
        # message could land before that turn began (both start together, in either order).
        talker=f"delay_ms: 500\n{TALK}\nTold them.\n===\nTalked.",
        listener="delay_ms: 2000\nWorking on the coast.\n===\nHeard: I take the currents.",
    )
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    sent = [e for e in talker.events if e.type == EventType.tool and data_of(e)["tool"] == "peers_message"]
    assert sent and not data_of(sent[0]).get("is_error")
    assert any(t.startswith("message to listener (step 1): I already covered the tides") for t in peer_events(talker))
    received = peer_events(listener)
    assert any(t.startswith("message from talker (step 0): I already covered the tides") for t in received), received
    assert "delivered to its next turn: message from talker (step 0)" in received
    # Delivered between its turns: after its first turn's span, before its second's.
    delivered = next(e for e in listener.events if e.text.startswith("delivered to its next turn"))
    assert len(listener.calls) == 2 and listener.calls[0].at <= delivered.t <= listener.calls[1].at
    assert svc.store.get_observed(run.tenant, run.id, 1) == {1: [n.id for n in svc.store.get_inbox(run.tenant, run.id, 1)]}
    layers = {layer.name: layer for layer in listener.prompt_layers}
    assert layers["peers"].dynamic


def test_a_message_to_a_colleague_that_has_ended_is_refused_and_the_talker_goes_on(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    ws = peers_workspace(tmp_path, talker=f"delay_ms: 3000\n{TALK}\nTried.", listener="Done at once.")
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    [call] = [e for e in talker.events if e.type == EventType.tool and data_of(e)["tool"] == "peers_message"]
    assert data_of(call)["is_error"] is True
    assert svc.store.get_inbox(run.tenant, run.id) == []
    assert listener.status == StepStatus.completed and peer_events(listener) == []


def test_a_message_to_no_such_colleague_names_the_choices(svc: Services, tmp_path: Path) -> None:
    ws = peers_workspace(
        tmp_path,
        talker='tool: peers_message {"to": "lisener", "text": "hi"}\ntool: peers_list {}\nTried.',
        listener="delay_ms: 300\nDone.",
    )
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    captures = sorted((tmp_path / "captures").rglob("*.json"))
    said = [json.loads(p.read_text()) for p in captures]
    wrong = next(c for c in said if c["tool"] == "peers_message")
    assert "no colleague 'lisener'" in wrong["output"] and "listener (step 1)" in wrong["output"]
    listed = json.loads(next(c for c in said if c["tool"] == "peers_list")["output"])
    assert listed == [{"agent": "listener", "index": 1, "item": None, "status": listed[0]["status"]}]


@pytest.mark.slow
def test_a_secret_in_a_message_never_reaches_a_stored_byte(on: ServicesOn, tmp_path: Path) -> None:
    secret = "tracker-secret-4f9a1c77e2"
    svc = on()
    talk = f'tool: peers_message {{"to": "listener", "text": "the token is {secret}"}}'
    ws = peers_workspace(tmp_path, talker=f"{talk}\nTold.", listener="delay_ms: 2000\nWorking.\n===\nDone.")
    for name in ("talker", "listener"):
        md = ws / "agents" / name / "agent.md"
        md.write_text(md.read_text().replace("tools:", "secrets: [TRACKER_TOKEN]\ntools:", 1))
    (ws / ".secrets.env").write_text(f"TRACKER_TOKEN={secret}\n")  # the workspace's own file: not a stored byte
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    [note] = svc.store.get_inbox(run.tenant, run.id, 1)
    assert note.text == "the token is [TRACKER_TOKEN]"
    assert secret.encode() not in stored_bytes(on.kind, tmp_path)


@pytest.mark.slow
def test_delivery_is_exactly_once_per_step_across_an_interrupted_attempt(tmp_path: Path) -> None:
    """A real `laneflow run` gets Ctrl-C after the listener's first attempt observed a
    message; a second message comes while it is away; `laneflow resume` runs its second
    attempt, which is given the second message only: the first is not sent twice."""
    import signal
    import subprocess
    import sys
    import time

    from laneflow.adapters.store import open_store
    from laneflow.domain.inbox import Note, NoteKind, new_note_id

    exe = Path(sys.executable).parent / "laneflow"
    ws = peers_workspace(
        tmp_path,
        talker=f"{TALK}\nTalked.",
        listener=["delay_ms: 2500\nOne.\n===\nTwo.\n===\nThree.", "Resumed.\n===\nDone."],
    )
    url = f"sqlite:///{tmp_path / 'int.db'}"
    proc = subprocess.Popen(
        [str(exe), "run", str(ws), "desk", "--store", url, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    store, run_id = None, None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and run_id is None:
        if (tmp_path / "int.db").exists():
            store = store or open_store(url)
            runs = store.list_runs("local")
            if runs and any(e.text.startswith("delivered") for e in store.get_step("local", runs[0].id, 1, detail=True).events):
                run_id = runs[0].id
        time.sleep(0.05)
    assert run_id and store, f"the message was never delivered: {stderr_of(proc) if proc.poll() is not None else 'timeout'}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [first] = store.get_inbox("local", run_id, 1)
    assert store.get_observed("local", run_id, 1) == {1: [first.id]}
    later = Note(
        id=new_note_id(NoteKind.message),
        run_id=run_id,
        kind=NoteKind.message,
        to_index=1,
        from_index=0,
        from_agent="talker",
        attempt=1,
        text="one more thing: the estuary too",
    )
    store.post_note("local", run_id, later)
    resumed = subprocess.run(
        [str(exe), "resume", run_id, "--store", url, "--quiet"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    run = store.get_run("local", run_id)
    assert run.status == RunStatus.completed, run.error
    listener = run.steps[1]
    assert listener.attempts == 2 and listener.conclusion == "Done."
    assert store.get_observed("local", run_id, 1) == {1: [first.id], 2: [later.id]}
    delivered = [(e.attempt, data_of(e)["note"]) for e in listener.events if e.text.startswith("delivered")]
    assert delivered == [(1, first.id), (2, later.id)]


def test_on_claude_the_listeners_next_request_carries_the_colleagues_message(tmp_path: Path) -> None:
    """The Claude executor, through the real SDK, against the Messages API imitation: the
    listener's second request holds the talker's message, after its tool result."""
    import time

    from laneflow.adapters.executors.anthropic import AnthropicExecutor
    from laneflow.adapters.store import open_store
    from laneflow.settings import Settings
    from laneflow.wiring import for_store
    from laneflow_dev.imitation import MessagesImitation, Reply

    key = "sk-test-0123456789abcdef"
    bodies: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> Reply:
        bodies.append(body)
        system = "".join(block["text"] for block in body["system"])
        k = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if "You are listener." in system:
            if k == 0:
                time.sleep(1.0)  # still working when the talker writes
                return Reply(text="Looking around.", tool_uses=[{"name": "peers_list", "input": {}}])
            return Reply(text="Heard: I take the currents.")
        if k == 0:
            return Reply(
                text="Telling.", tool_uses=[{"name": "peers_message", "input": {"to": 1, "text": "I already covered the tides"}}]
            )
        return Reply(text="Told.")

    agents = {"talker": {"tools": ["peers"]}, "listener": {"tools": ["peers"]}}
    flow = {"description": "two colleagues", "steps": [{"group": [{"agent": "talker"}, {"agent": "listener"}]}]}
    ws = write_workspace(tmp_path / "ws", agents, {"desk": flow}, agents_md="model: claude-sonnet-4-6\n")
    with MessagesImitation(api_keys={key}, responder=respond) as api:
        settings = Settings(anthropic_api_key=SecretStr(key), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=api.url, backoff_s=0.01)
        run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    assert listener.conclusion == "Heard: I take the currents."
    second = [b for b in bodies if "You are listener." in "".join(x["text"] for x in b["system"])][1]
    last = second["messages"][-1]["content"]
    assert [block["type"] for block in last] == ["tool_result", "text"]
    assert "message from your colleague talker (step 0)" in last[1]["text"] and "I already covered the tides" in last[1]["text"]
    assert "never a hand-over" in last[1]["text"]
    tools = [t["name"] for t in second["tools"]]
    assert tools == ["peers_list", "peers_message"]
    assert "peers" in [layer.name for layer in listener.prompt_layers]
    assert "Colleagues" in second["system"][-1]["text"] and "talker (step 0" in second["system"][-1]["text"]
    assert any(t.startswith("message to listener (step 1)") for t in peer_events(talker))
    assert "delivered to its next turn: message from talker (step 0)" in peer_events(listener)


@pytest.mark.slow
def test_a_sandboxed_step_messages_and_hears_its_colleague_from_its_worker_process(on: ServicesOn, tmp_path: Path) -> None:
    """A talker and a listener that both run in sandbox workers (child processes of the
    engine): the message goes through the store between the two processes."""
    import os

    svc = on()
    ws = peers_workspace(
        tmp_path,
        talker=f"{TALK}\nTold them.",
        listener="delay_ms: 3000\nWorking on the coast.\n===\nHeard.",
    )
    for name in ("talker", "listener"):
        md = ws / "agents" / name / "agent.md"
        md.write_text(md.read_text().replace("tools:", "sandbox: true\ntools:", 1))
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    workers = [a.worker for a in svc.store.list_attempts(run.tenant, run.id)]
    assert all(w is not None and w.kind == "local" and w.pid != os.getpid() for w in workers)  # each in its own worker
    assert any(t.startswith("message to listener (step 1)") for t in peer_events(talker))
    assert "delivered to its next turn: message from talker (step 0)" in peer_events(listener)


@pytest.mark.slow
def test_the_scouts_example_splits_the_coast_through_peers(svc: Services) -> None:
    from helpers import drive as drive_run

    root = Path(__file__).resolve().parents[2] / "examples" / "scouts"
    run = drive_run(svc, root, "survey")
    assert run.status == RunStatus.completed, run.error
    north, south, editor = run.steps
    assert any(t.startswith("message to south-scout (step 1): I already covered the harbours") for t in peer_events(north))
    assert "delivered to its next turn: message from north-scout (step 0)" in peer_events(south)
    assert "estuaries only" in (south.conclusion or "") and editor.status == StepStatus.completed


@pytest.mark.slow
def test_with_capture_metadata_the_peer_events_keep_sizes_not_texts(svc: Services, tmp_path: Path) -> None:
    agents = {
        "talker": {"tools": ["peers"], "stub": f"{TALK}\nTold."},
        "listener": {"tools": ["peers"], "stub": "delay_ms: 2000\nWorking.\n===\nDone."},
    }
    flow = {"description": "two colleagues", "steps": [{"group": [{"agent": "talker"}, {"agent": "listener"}]}]}
    ws = write_workspace(tmp_path / "ws", agents, {"desk": flow}, agents_md="model: stub\ncapture: metadata\n")
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    texts = [t for step in run.steps for t in peer_events(step)]
    assert "message to listener (step 1) (46 characters)" in texts and "message from talker (step 0) (46 characters)" in texts
    assert not any("tides" in t for step in run.steps for e in step.events for t in [e.text])
    [note] = svc.store.get_inbox(run.tenant, run.id, 1)  # the note keeps its text: it is delivered
    assert "tides" in note.text
