"""One attempt's colleagues and inbox (`tools: [peers]`, `tools: [ask]`): the `StepInbox` an
executor reaches through its sink.

- `peers()`: the other steps launched in the step's group (agent, index, item, status).
- `send(to, text)`: a message to a colleague named by agent or index, kept in the store and
  delivered between the recipient's turns; refused (`NoteRefused`) to an ended, unknown or
  ambiguous colleague. An event on both steps.
- `take()`: what the step has not yet been given, recorded as observed by this attempt
  before it is handed over: exactly once per step, not per attempt (an attempt interrupted
  before it saw a message gets it on resume; one that saw it is not sent it twice).
- `ask(question)`: a question to a person, answered with `laneflow answer`, the API or the
  viewer; the wait is bounded by the agent's `ask_timeout`, the step's own deadline and, in
  Lambda, the invocation's remaining time minus a margin. A stop ends it at once.

Texts reach the store through its redactor like every record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from laneflow.domain.errors import StepStopped
from laneflow.domain.inbox import (
    ASK,
    MAX_NOTE_CHARS,
    PEERS,
    Note,
    NoteKind,
    NoteRefused,
    Peer,
    QuestionStatus,
    ask_wait,
    new_note_id,
    undelivered,
)
from laneflow.domain.records import Attempt, AttemptRef, Event, EventType, Run, Step, StepStatus
from laneflow.domain.workers import LambdaRequest, WorkerRef
from laneflow.domain.workspace import Agent
from laneflow.ports import Services
from laneflow.usecases.run_step.recorder import StepRecorder

ASK_POLL_S = 0.25  # how often a waiting ask reads the store for its answer

ENDED = (StepStatus.completed, StepStatus.failed, StepStatus.skipped)


def _text(what: str, text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise NoteRefused(f"{what} must be a non-empty string")
    if len(text) > MAX_NOTE_CHARS:
        raise NoteRefused(f"{what} is {len(text):,} characters; at most {MAX_NOTE_CHARS:,}")
    if "\x00" in text:
        raise NoteRefused(f"{what} cannot hold a NUL character")
    return text


def group_peers(svc: Services, run: Run, step: Step) -> list[Peer]:
    """The other steps launched in `step`'s group (its rescue records aside), as they stand now."""
    steps = svc.store.get_steps(run.tenant, run.id, group=step.group)
    return [
        Peer(agent=s.agent or "", index=s.index, item=s.item, status=s.status.value)
        for s in steps
        if s.index != step.index and s.rescue_of is None and s.agent
    ]


def _who(peer: Peer) -> str:
    return f"{peer.agent} (step {peer.index})"


@dataclass
class AttemptInbox:
    """The `StepInbox` of one attempt (see the module docstring)."""

    svc: Services
    run: Run
    step: Step
    ref: AttemptRef
    agent: str
    stopped: Callable[[], bool]
    ask_timeout: float
    step_deadline: float | None = None  # time.monotonic() when the step's own timeout ends
    worker: WorkerRef | None = None
    capture: bool = True  # `capture: metadata`: events keep sizes, never the texts
    poll_s: float = ASK_POLL_S
    _seen: set[str] = field(default_factory=set)

    # -- peers ---------------------------------------------------------------------------

    def peers(self) -> list[Peer]:
        return group_peers(self.svc, self.run, self.step)

    def _recipient(self, to: object) -> Peer:
        peers = self.peers()
        choices = ", ".join(_who(p) for p in peers) or "none: this step runs alone in its group"
        if isinstance(to, bool) or not isinstance(to, (str, int)) or (isinstance(to, str) and not to.strip()):
            raise NoteRefused(f'peers_message takes {{"to": AGENT or INDEX, "text": "..."}}; the colleagues are {choices}')
        name = str(to).strip()
        if name.lstrip("-").isdigit():
            index = int(name)
            if index == self.step.index:
                raise NoteRefused("that is this step itself; a message goes to a colleague")
            found = [p for p in peers if p.index == index]
        else:
            if name == self.agent and not any(p.agent == name for p in peers):
                raise NoteRefused("that is this step itself; a message goes to a colleague")
            found = [p for p in peers if p.agent == name]
        if not found:
            raise NoteRefused(f"no colleague {name!r} in this group; the colleagues are {choices}")
        if len(found) > 1:
            raise NoteRefused(f"{name} runs as steps {', '.join(str(p.index) for p in found)} here; name one by its index")
        return found[0]

    def send(self, to: str, text: str) -> Note:
        text = _text("the message's text", text)
        peer = self._recipient(to)
        if peer.status in ENDED:
            raise NoteRefused(f"{_who(peer)} has ended ({peer.status}): it can no longer read messages")
        note = Note(
            id=new_note_id(NoteKind.message),
            run_id=self.ref.run_id,
            kind=NoteKind.message,
            to_index=peer.index,
            from_index=self.step.index,
            from_agent=self.agent,
            attempt=self.ref.n,
            text=text,
        )
        store = self.svc.store
        store.post_note(self.ref.tenant, self.ref.run_id, note)
        shown = f": {text}" if self.capture else f" ({len(text):,} characters)"
        data = {"note": note.id, "to": peer.index}
        store.add_event(
            self.ref.tenant,
            self.ref.run_id,
            self.step.index,
            Event(type=EventType.peer, text=f"message to {_who(peer)}{shown}", data=data),
            attempt=self.ref,
        )
        received = Event(
            type=EventType.peer,
            text=f"message from {self.agent} (step {self.step.index}){shown}",
            data={"note": note.id, "from": self.step.index},
        )
        store.add_event(self.ref.tenant, self.ref.run_id, peer.index, received)
        return note

    # -- delivery ------------------------------------------------------------------------

    def _observed(self) -> set[str]:
        found = self.svc.store.get_observed(self.ref.tenant, self.ref.run_id, self.step.index)
        return self._seen | {i for ids in found.values() for i in ids}

    def take(self) -> list[Note]:
        notes = self.svc.store.get_inbox(self.ref.tenant, self.ref.run_id, self.step.index)
        if not notes:
            return []
        pending = undelivered(notes, self._observed(), self.step.index)
        if not pending:
            return []
        ids = [n.delivery_id for n in pending]
        # Observed before it is handed over: a crash after this never sends it twice.
        self.svc.store.observe(self.ref, ids)
        self._seen.update(ids)
        for note in pending:
            what = (
                f"message from {note.from_agent} (step {note.from_index})"
                if note.kind == NoteKind.message
                else "an answer to its question"
            )
            self.svc.store.add_event(
                self.ref.tenant,
                self.ref.run_id,
                self.step.index,
                Event(
                    type=EventType.peer if note.kind == NoteKind.message else EventType.ask,
                    text=f"delivered to its next turn: {what}",
                    data={"note": note.id},
                ),
                attempt=self.ref,
            )
        return pending

    # -- ask -----------------------------------------------------------------------------

    def wait_s(self) -> float:
        now = time.monotonic()
        step_left = self.step_deadline - now if self.step_deadline is not None else None
        lambda_left = self.worker.deadline - time.time() if isinstance(self.worker, LambdaRequest) else None
        return ask_wait(self.ask_timeout, step_left=step_left, lambda_left=lambda_left)

    def ask(self, question: str) -> str:
        question = _text("the question", question)
        wait = self.wait_s()
        note = Note(
            id=new_note_id(NoteKind.question),
            run_id=self.ref.run_id,
            kind=NoteKind.question,
            to_index=self.step.index,
            from_index=self.step.index,
            from_agent=self.agent,
            attempt=self.ref.n,
            text=question,
            status=QuestionStatus.open,
        )
        store, tenant, run_id, index = self.svc.store, self.ref.tenant, self.ref.run_id, self.step.index
        store.post_note(tenant, run_id, note)
        shown = f": {question}" if self.capture else f" ({len(question):,} characters)"
        how = f"laneflow answer {run_id} {index} TEXT"
        self._event(
            f"asked a person{shown} (waiting up to {wait:g} s; answer with `{how}` on the store the run is on)",
            {"note": note.id, "wait_s": wait},
        )
        answered = self._wait(note, wait)
        if answered is None:
            self._event(f"no answer within {wait:g} s; the step goes on", {"note": note.id})
            return f"no answer within {wait:g} s; go on without it, and say what you assumed"
        store.observe(self.ref, [answered.delivery_id])
        self._seen.add(answered.delivery_id)
        said = f": {answered.answer}" if self.capture else f" ({len(answered.answer or ''):,} characters)"
        self._event(f"a person answered{said}", {"note": note.id})
        return answered.answer or ""

    def _event(self, text: str, data: dict[str, object]) -> None:
        self.svc.store.add_event(
            self.ref.tenant,
            self.ref.run_id,
            self.step.index,
            Event(type=EventType.ask, text=text, data=dict(data)),
            attempt=self.ref,
        )

    def _wait(self, note: Note, wait: float) -> Note | None:
        """The answered question, or None when the wait ended without one. A stop ends it at
        once (the question expires; the attempt ends stopped)."""
        store, tenant, run_id = self.svc.store, self.ref.tenant, self.ref.run_id
        end = time.monotonic() + wait
        while True:
            found = store.get_note(tenant, run_id, note.id)  # one read of one item
            if found.status == QuestionStatus.answered:
                return found
            if self.stopped():
                store.close_question(tenant, run_id, note.id)
                raise StepStopped("stopped by a person while it waited for an answer to its question")
            left = end - time.monotonic()
            if left <= 0:
                closed = store.close_question(tenant, run_id, note.id)
                return closed if closed.status == QuestionStatus.answered else None
            time.sleep(min(self.poll_s, left))


def attempt_inbox(
    svc: Services, run: Run, step: Step, attempt: Attempt, agent: Agent, recorder: StepRecorder, *, capture: bool
) -> AttemptInbox | None:
    """The inbox of an attempt whose agent has `peers` or `ask` (None otherwise: a step
    without them never reads an inbox)."""
    tools = set(agent.settings.tools)
    if PEERS not in tools and ASK not in tools:
        return None
    timeout = agent.settings.timeout
    return AttemptInbox(
        svc=svc,
        run=run,
        step=step,
        ref=AttemptRef.of(run.tenant, attempt),
        agent=agent.name,
        stopped=recorder.stopped,
        ask_timeout=agent.settings.ask_timeout,
        step_deadline=time.monotonic() + timeout if timeout else None,
        worker=attempt.worker,
        capture=capture,
    )


def expire_questions(svc: Services, tenant: str, run_id: str, index: int, n: int) -> None:
    """The questions attempt `n` of a step left open are no longer waited on (its worker went
    away): they expire, so no person is asked to answer into the void."""
    for note in svc.store.get_inbox(tenant, run_id, index):
        if note.kind == NoteKind.question and note.status == QuestionStatus.open and note.attempt == n:
            svc.store.close_question(tenant, run_id, note.id)
