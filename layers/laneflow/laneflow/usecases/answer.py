"""A person answers a step's question (its `ask` tool), from the CLI (`laneflow answer`), the
API (`POST /runs/{id}/steps/{index}/answer`) or the viewer; and the questions still waiting,
so a person can find them."""

from __future__ import annotations

from dataclasses import dataclass

from laneflow.domain.errors import Conflict, InvalidInput, LaneflowError, NotFound
from laneflow.domain.inbox import MAX_NOTE_CHARS, Note, NoteKind, QuestionStatus
from laneflow.domain.records import Event, EventType, StepStatus, utcnow
from laneflow.ports import Services
from laneflow.usecases.masking import masking_of


class NoQuestionWaiting(LaneflowError):
    """An answer for a step that has no question waiting (none asked, answered already, or
    its wait is over)."""

    exit_code = 2
    http_status = 409


@dataclass(frozen=True)
class WaitingQuestion:
    """A question a step is waiting on: where to answer it."""

    tenant: str
    run_id: str
    index: int
    agent: str | None
    question: str
    asked_at: str
    id: str


def answer_text(text: object) -> str:
    """An answer as given: non-empty text of at most MAX_NOTE_CHARS characters."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("the answer must be non-empty text")
    if len(text) > MAX_NOTE_CHARS:
        raise InvalidInput(f"the answer is {len(text):,} characters; at most {MAX_NOTE_CHARS:,}")
    if "\x00" in text:
        raise InvalidInput("the answer cannot hold a NUL character")
    return text


def answer_question(svc: Services, tenant: str, run_id: str, index: int, text: object) -> Note:
    """Answer the question step `index` of the run is waiting on (its latest open one).
    `InvalidInput` for an empty answer, `RunNotFound` / `NotFound` for no such run or step,
    `NoQuestionWaiting` when the step waits on none. A person's answer is a record of the run:
    masked with the run's secrets like every other."""
    text = answer_text(text)
    with masking_of(svc, tenant, run_id):
        return _answer(svc, tenant, run_id, index, text)


def _answer(svc: Services, tenant: str, run_id: str, index: int, text: str) -> Note:
    store = svc.store
    step = store.get_step(tenant, run_id, index)  # RunNotFound, NotFound
    questions = [n for n in store.get_inbox(tenant, run_id, index) if n.kind == NoteKind.question]
    open_ = [n for n in questions if n.status == QuestionStatus.open]
    if not open_:
        said = f"its last question is {questions[-1].status}" if questions else "it asked none"
        raise NoQuestionWaiting(f"step {index} of run {run_id} is waiting on no question ({said}; the step is {step.status})")
    try:
        answered = store.answer_question(tenant, run_id, open_[-1].id, text, at=utcnow())
    except (Conflict, NotFound) as error:
        raise NoQuestionWaiting(f"step {index} of run {run_id}: {error}") from None
    store.add_event(tenant, run_id, index, Event(type=EventType.ask, text="answered by a person", data={"note": answered.id}))
    return answered


def waiting_questions(svc: Services, tenant: str | None = None, run_id: str | None = None) -> list[WaitingQuestion]:
    """The questions steps are waiting on now (of one tenant, or one run), oldest first: open,
    and asked by a step still running (a question left open by a worker that went away is not
    waited on)."""
    found = []
    for owner, note in svc.store.list_open_questions(tenant):
        if run_id is not None and note.run_id != run_id:
            continue
        try:
            step = svc.store.get_step(owner, note.run_id, note.to_index)
        except NotFound:
            continue
        if step.status != StepStatus.running:
            continue
        found.append(
            WaitingQuestion(
                tenant=owner,
                run_id=note.run_id,
                index=note.to_index,
                agent=note.from_agent,
                question=note.text,
                asked_at=note.at,
                id=note.id,
            )
        )
    return found
