"""The colleague tools of a step (`tools: [peers]`: `peers_list`, `peers_message`; `tools:
[ask]`: `ask`), over the step's inbox (`ports.StepInbox`, which the run's use case gives the
executor's sink), and how pending notes join a model's next turn.

Both executors reach them through `StepTools`: the Claude tool-use loop and the stub's `tool:`
lines, so a message or a question is recorded the same way whoever sends it. A refused
message or question (`NoteRefused`) is the tool's own failure: an `is_error` result.
"""

from __future__ import annotations

import json
from typing import Any

from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.inbox import ASK, PEERS, Note, NoteRefused, delivered_text
from laneflow.ports import ExecutionSink, StepInbox, StepJob

DEFINITIONS: dict[str, dict[str, Any]] = {
    "peers_list": {
        "name": "peers_list",
        "description": (
            "List the colleagues working beside you in this group of the run: each one's agent, step index, "
            "item and status (pending, running, completed...)."
        ),
        "input_schema": {"type": "object", "properties": {}},
    },
    "peers_message": {
        "name": "peers_message",
        "description": (
            "Send a short message to a colleague of this group (by agent name or step index). It reaches them "
            'between their turns. A message is a request or a note ("I already covered X"), never a hand-over '
            "of your own task. A colleague that has ended cannot receive it."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": 'the colleague\'s agent name, or its step index (such as "2")'},
                "text": {"type": "string", "description": "what you tell them"},
            },
            "required": ["to", "text"],
        },
    },
    "ask": {
        "name": "ask",
        "description": (
            "Ask a person one clear question and wait for the answer (bounded: if none comes in time, you are "
            "told so and go on). Only for what you cannot find out or decide yourself."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"question": {"type": "string", "description": "the question, with the options if there are any"}},
            "required": ["question"],
        },
    },
}


def granted(tools: tuple[str, ...] | list[str]) -> list[str]:
    """The colleague tools `tools:` grants, in name order."""
    names = []
    if PEERS in tools:
        names += ["peers_list", "peers_message"]
    if ASK in tools:
        names.append("ask")
    return sorted(names)


class PeerTools:
    """The colleague tools one attempt has (none without an inbox)."""

    def __init__(self, job: StepJob, sink: ExecutionSink):
        self.inbox: StepInbox | None = getattr(sink, "inbox", None)
        # Granted by `tools:`, so listed (a definition is part of the cached prefix) even by a
        # sink that only reads definitions; run only through the step's inbox.
        self.names = granted(job.tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [DEFINITIONS[name] for name in self.names]

    def run(self, name: str, args: dict[str, Any]) -> str:
        if self.inbox is None:
            raise ToolError(f"{name}: this step has no colleagues' inbox here")
        try:
            if name == "peers_list":
                peers = self.inbox.peers()
                rows = [{"agent": p.agent, "index": p.index, "item": p.item, "status": p.status} for p in peers]
                return json.dumps(rows, ensure_ascii=False) if rows else "[] (you run alone in this group)"
            if name == "peers_message":
                unknown = sorted(set(args) - {"to", "text"})
                if unknown:
                    raise NoteRefused(f'peers_message takes {{"to": AGENT or INDEX, "text": "..."}}; not {", ".join(unknown)}')
                note = self.inbox.send(args.get("to"), args.get("text"))  # type: ignore[arg-type]
                return f"sent to step {note.to_index}: it reaches them between their turns"
            unknown = sorted(set(args) - {"question"})
            if unknown:
                raise NoteRefused(f'ask takes {{"question": "..."}}; not {", ".join(unknown)}')
            return self.inbox.ask(args.get("question"))  # type: ignore[arg-type]
        except NoteRefused as refused:
            raise ToolError(f"{name}: {refused}") from None

    def pending(self) -> list[str]:
        """What the step has not yet been given, as the texts its next turn carries (each
        recorded as observed by this attempt)."""
        if self.inbox is None or not self.names:  # a judge's call on the same sink takes nothing
            return []
        notes: list[Note] = self.inbox.take()
        return [delivered_text(n) for n in notes]
