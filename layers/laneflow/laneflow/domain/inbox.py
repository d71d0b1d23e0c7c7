"""A step's inbox: what colleagues of its group (`peers_message`) and people (answers to its
`ask` questions) send it while it works, kept with the run.

- A `Note` is one entry of a run's inboxes: a `message` from one step to another, or a
  `question` a step put to a person (its own inbox holds it), which a person answers once
  (`open` -> `answered`) unless the step stopped waiting first (`open` -> `expired`).
- Delivery is exactly-once per step, not per attempt: each attempt records the ids of what
  it has observed (`delivery_id`: a message's id, or a question's answer), and a step is
  given only what none of its attempts has observed. An attempt interrupted before it saw a
  message gets it on resume; one that saw it is not sent it twice.
- The text of a note is a request, never a hand-over of the recipient's work.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field

from laneflow.domain.records import Record, utcnow

MAX_NOTE_CHARS = 20_000  # a message or a question longer than this is refused (it is a note, not a file)

DEFAULT_ASK_TIMEOUT_S = 600.0

ASK_TIMEOUT_BOUNDS = (1.0, 86_400.0)  # agent.md `ask_timeout:`: a second to a day

LAMBDA_MARGIN_S = 30.0  # in Lambda, an ask stops waiting this long before the invocation's deadline

PEERS = "peers"  # the tool grant: peers_list and peers_message

ASK = "ask"  # the tool grant: ask

PEER_TOOLS = ("peers_list", "peers_message")

_NOTE_ID = re.compile(r"^[a-z]-[0-9a-f]{4,64}$")


class NoteRefused(ValueError):
    """A message or a question that cannot be sent (an ended or unknown colleague, an empty
    text): the tool's own failure, an `is_error` result naming why."""


@dataclass(frozen=True)
class Peer:
    """A colleague of a step: another step launched in its group."""

    agent: str
    index: int
    item: Any
    status: str


class NoteKind(StrEnum):
    message = "message"  # from a colleague of the step's group
    question = "question"  # the step's own question to a person


class QuestionStatus(StrEnum):
    open = "open"  # waiting for a person
    answered = "answered"
    expired = "expired"  # the step stopped waiting (no answer in time, a stop, its end)


class Note(Record):
    """One entry of a step's inbox (see the module docstring)."""

    id: str
    run_id: str
    kind: NoteKind
    to_index: int  # whose inbox holds it: the recipient (a message) or the asking step (a question)
    from_index: int | None = None  # the sending step (a message), the asking step (a question)
    from_agent: str | None = None
    attempt: int | None = None  # the sender's attempt
    text: str
    at: str = Field(default_factory=utcnow)
    status: QuestionStatus | None = None  # questions only
    answer: str | None = None
    answered_at: str | None = None

    @property
    def delivery_id(self) -> str:
        """What an attempt records having observed: a message's id, a question's answer."""
        return self.id if self.kind == NoteKind.message else f"{self.id}.answer"


def new_note_id(kind: NoteKind) -> str:
    """A fresh id that sorts in the order notes are made (the time in ns, then a random part),
    so two notes of one millisecond still read back in the order they were sent."""
    return f"{kind.value[0]}-{time.time_ns():016x}{secrets.token_hex(4)}"


def valid_note_id(text: str) -> bool:
    return bool(_NOTE_ID.match(text))


def undelivered(notes: list[Note], observed: set[str], index: int) -> list[Note]:
    """What step `index` has not yet been given, oldest first: messages to it, and answers
    to its questions, that none of its attempts has observed."""
    out = []
    for note in notes:
        if note.to_index != index or note.delivery_id in observed:
            continue
        if note.kind == NoteKind.message or note.status == QuestionStatus.answered:
            out.append(note)
    return sorted(out, key=lambda n: (n.answered_at or n.at, n.id))


def delivered_text(note: Note) -> str:
    """How a note reaches the step's next turn."""
    if note.kind == NoteKind.message:
        who = f"{note.from_agent} (step {note.from_index})" if note.from_agent else f"step {note.from_index}"
        return (
            f"[A message from your colleague {who}. It is a request or a note, never a hand-over: "
            f"your own task stays yours.]\n{note.text}"
        )
    return f"[A person answered your question {note.text!r}:]\n{note.answer}"


def ask_wait(ask_timeout: float, *, step_left: float | None, lambda_left: float | None) -> float:
    """How long an `ask` may wait: the agent's `ask_timeout`, never past the step's own
    deadline, nor (in Lambda) past the invocation's remaining time minus LAMBDA_MARGIN_S."""
    wait = ask_timeout
    if step_left is not None:
        wait = min(wait, step_left)
    if lambda_left is not None:
        wait = min(wait, lambda_left - LAMBDA_MARGIN_S)
    return max(0.0, wait)
