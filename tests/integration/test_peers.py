"""Colleagues of a group talk while they work (`tools: [peers]`), on both stores and through
the real definition on the embedded engine: a message reaches a listener that is still
working between its turns, both records show it, a message to a colleague that has ended is
refused, messages are masked like every record, and delivery is exactly-once per step across
an interrupted attempt."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import drive, stored_bytes, write_workspace

from laneflow.domain.records import EventType, RunStatus, StepStatus

TALK = 'tool: peers_message {"to": "listener", "text": "I already covered the tides; take the currents"}'


def peers_workspace(root: Path, *, talker: str, listener: str, **extra_agents: dict) -> Path:
    agents = {
        "talker": {"tools": ["peers"], "stub": talker},
        "listener": {"tools": ["peers"], "stub": listener},
        **extra_agents,
    }
    flow = {"description": "two colleagues", "steps": [{"group": [{"agent": "talker"}, {"agent": "listener"}]}]}
    return write_workspace(root / "ws", agents, {"desk": flow})


def peer_events(step) -> list[str]:
    return [e.text for e in step.events if e.type == EventType.peer]


def test_a_talker_messages_a_working_listener_whose_next_turn_carries_it(on, tmp_path):
    svc = on()
    ws = peers_workspace(
        tmp_path,
        talker=f"{TALK}\nTold them.\n===\nTalked.",
        listener="delay_ms: 700\nWorking on the coast.\n===\nHeard: I take the currents.",
    )
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    sent = [e for e in talker.events if e.type == EventType.tool and e.data["tool"] == "peers_message"]
    assert sent and not sent[0].data.get("is_error")
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


def test_a_message_to_a_colleague_that_has_ended_is_refused_and_the_talker_goes_on(on, tmp_path):
    svc = on()
    ws = peers_workspace(tmp_path, talker=f"delay_ms: 1500\n{TALK}\nTried.", listener="Done at once.")
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    talker, listener = run.steps
    [call] = [e for e in talker.events if e.type == EventType.tool and e.data["tool"] == "peers_message"]
    assert call.data["is_error"] is True
    assert svc.store.get_inbox(run.tenant, run.id) == []
    assert listener.status == StepStatus.completed and peer_events(listener) == []


def test_a_message_to_no_such_colleague_names_the_choices(svc, tmp_path):
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


def test_a_secret_in_a_message_never_reaches_a_stored_byte(on, tmp_path):
    secret = "tracker-secret-4f9a1c77e2"
    svc = on()
    talk = f'tool: peers_message {{"to": "listener", "text": "the token is {secret}"}}'
    ws = peers_workspace(tmp_path, talker=f"{talk}\nTold.", listener="delay_ms: 700\nWorking.\n===\nDone.")
    for name in ("talker", "listener"):
        md = ws / "agents" / name / "agent.md"
        md.write_text(md.read_text().replace("tools:", "secrets: [TRACKER_TOKEN]\ntools:", 1))
    (ws / ".secrets.env").write_text(f"TRACKER_TOKEN={secret}\n")  # the workspace's own file: not a stored byte
    run = drive(svc, ws, "desk")
    assert run.status == RunStatus.completed, run.error
    [note] = svc.store.get_inbox(run.tenant, run.id, 1)
    assert note.text == "the token is [TRACKER_TOKEN]"
    assert secret.encode() not in stored_bytes(on.kind, tmp_path)
