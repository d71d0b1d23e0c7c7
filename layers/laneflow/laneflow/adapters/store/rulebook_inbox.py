"""The rule book's rules of handoffs, the warm gate and inboxes (peers, ask)."""

from __future__ import annotations

from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.rulebook_base import (
    RuleBase,
    _entry,
    attempt_ended,
)
from laneflow.domain.errors import Conflict, NotFound, RunNotFound
from laneflow.domain.gate import GateClaim, GatePass, GateWaiter
from laneflow.domain.inbox import Note, NoteKind, QuestionStatus
from laneflow.domain.records import (
    AttemptRef,
)
from laneflow.domain.tenants import check_tenant


class InboxRules(RuleBase):
    """The public methods of handoffs, the warm gate and inboxes."""

    # -- handoffs ------------------------------------------------------------------------

    @_entry("text")
    def put_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        check_tenant(tenant)
        if not self._run_exists(tenant, run_id):  # runs are never deleted: a read is enough
            raise RunNotFound(run_id)
        self._write_handoff(tenant, run_id, key, text)

    @_entry()
    def get_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        check_tenant(tenant)
        return self._read_handoff(tenant, run_id, key)

    # -- the warm gate ---------------------------------------------------------------------

    @_entry()
    def gate_wait(
        self, tenant: str, run_id: str, key: str, token: str, *, index: int | None = None, until_lead_ends: bool = False
    ) -> GatePass | None:
        check_tenant(tenant)
        return self._gate_wait(tenant, run_id, key, GateWaiter(token=token, index=index, until_lead_ends=until_lead_ends))

    @_entry()
    def gate_open(
        self, tenant: str, run_id: str, key: str, *, lead_ended: bool = False, note: str | None = None
    ) -> list[GateWaiter]:
        check_tenant(tenant)
        return self._gate_open(tenant, run_id, key, lead_ended=lead_ended, note=note)

    @_entry()
    def gate_claim(self, tenant: str, run_id: str, key: str) -> GateClaim:
        check_tenant(tenant)
        return self._gate_claim(tenant, run_id, key)

    # -- inboxes (peers, ask) ----------------------------------------------------------------

    @_entry("note")
    def post_note(self, tenant: str, run_id: str, note: Note) -> None:
        check_tenant(tenant)
        if note.run_id != run_id:
            raise ValueError(f"the note names run {note.run_id!r}, not {run_id!r}")
        if self._read_step_state(tenant, run_id, note.to_index, None) is None:  # steps are never deleted
            raise self._missing_step(tenant, run_id, note.to_index)
        try:
            self._write_note(tenant, note, replaces_open=False)
        except Refused:
            raise Conflict(f"note {note.id!r} of run {run_id!r} exists") from None

    @_entry()
    def get_inbox(self, tenant: str, run_id: str, index: int | None = None) -> list[Note]:
        check_tenant(tenant)
        notes = self._read_notes(tenant, run_id)
        if not notes and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return sorted((n for n in notes if index is None or n.to_index == index), key=lambda n: (n.at, n.id))

    @_entry()
    def get_note(self, tenant: str, run_id: str, note_id: str) -> Note:
        check_tenant(tenant)
        found = self._note(tenant, run_id, note_id)
        if found is None:
            if not self._run_exists(tenant, run_id):
                raise RunNotFound(run_id)
            raise NotFound(f"no note {note_id!r} in run {run_id!r}")
        return found

    def _note(self, tenant: str, run_id: str, note_id: str) -> Note | None:
        found = self._read_notes(tenant, run_id, note_id)
        return found[0] if found else None

    def _question(self, tenant: str, run_id: str, note_id: str) -> Note:
        found = self._note(tenant, run_id, note_id)
        if found is None or found.kind != NoteKind.question:
            if not self._run_exists(tenant, run_id):
                raise RunNotFound(run_id)
            raise NotFound(f"no question {note_id!r} in run {run_id!r}")
        return found

    @_entry("text")
    def answer_question(self, tenant: str, run_id: str, note_id: str, text: str, *, at: str) -> Note:
        check_tenant(tenant)
        question = self._question(tenant, run_id, note_id)
        if question.status != QuestionStatus.open:
            raise Conflict(f"question {note_id!r} of step {question.to_index} is {question.status}, not open")
        answered = question.model_copy(update={"status": QuestionStatus.answered, "answer": text, "answered_at": at})
        try:
            self._write_note(tenant, answered, replaces_open=True)
        except Refused as refused:
            status = refused.found.status if isinstance(refused.found, Note) else "gone"
            raise Conflict(f"question {note_id!r} of step {question.to_index} is {status}, not open") from None
        return answered

    @_entry()
    def close_question(self, tenant: str, run_id: str, note_id: str) -> Note:
        check_tenant(tenant)
        question = self._question(tenant, run_id, note_id)
        if question.status != QuestionStatus.open:
            return question
        closed = question.model_copy(update={"status": QuestionStatus.expired})
        try:
            self._write_note(tenant, closed, replaces_open=True)
        except Refused as refused:
            if isinstance(refused.found, Note):
                return refused.found  # answered meanwhile: the answer wins
            raise
        return closed

    @_entry()
    def observe(self, ref: AttemptRef, ids: list[str]) -> None:
        check_tenant(ref.tenant)
        if not ids:
            return
        try:
            self._append(ref.tenant, ref.run_id, ref.index, list(ids), ref)
        except Refused as refused:
            raise attempt_ended(ref, refused.found) from None

    @_entry()
    def get_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        check_tenant(tenant)
        return self._read_observed(tenant, run_id, index)

    @_entry()
    def list_open_questions(self, tenant: str | None = None) -> list[tuple[str, Note]]:
        if tenant is not None:
            check_tenant(tenant)
        found = [(t, n) for t, n in self._open_questions(tenant) if n.status == QuestionStatus.open]
        return sorted(found, key=lambda tn: (tn[1].at, tn[1].id))
