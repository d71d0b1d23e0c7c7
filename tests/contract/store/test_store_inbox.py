"""Inboxes (peers, ask): notes between the steps of a run, questions answered once, and
what each attempt has observed, fenced by the attempt's identity."""

from __future__ import annotations

import threading

import pytest

from contract.store.backends import TENANT, claim, new_run, snapshot
from laneflow.adapters.store import Store
from laneflow.domain.errors import AttemptEnded, Conflict, NotFound, RunNotFound
from laneflow.domain.inbox import Note, NoteKind, QuestionStatus, new_note_id, undelivered
from laneflow.domain.records import AttemptStatus, Run, utcnow


def message(run_id: str, to: int, text: str, *, sender: int = 0) -> Note:
    return Note(
        id=new_note_id(NoteKind.message),
        run_id=run_id,
        kind=NoteKind.message,
        to_index=to,
        from_index=sender,
        from_agent="scout",
        attempt=1,
        text=text,
    )


def question(run_id: str, index: int, text: str) -> Note:
    return Note(
        id=new_note_id(NoteKind.question),
        run_id=run_id,
        kind=NoteKind.question,
        to_index=index,
        from_index=index,
        from_agent="scout",
        attempt=1,
        text=text,
        status=QuestionStatus.open,
    )


def test_a_note_is_kept_in_its_recipients_inbox_in_order_and_an_id_is_taken_once(store: Store) -> None:
    run = new_run(store)
    first, second, other = message(run.id, 1, "I covered tides"), message(run.id, 1, "and currents"), message(run.id, 2, "hi")
    for note in (first, second, other):
        store.post_note(TENANT, run.id, note)
    assert [n.id for n in store.get_inbox(TENANT, run.id, 1)] == [first.id, second.id]
    assert {n.id for n in store.get_inbox(TENANT, run.id)} == {first.id, second.id, other.id}
    assert store.get_inbox(TENANT, run.id, 1)[0] == first == store.get_note(TENANT, run.id, first.id)
    with pytest.raises(NotFound):
        store.get_note(TENANT, run.id, "m-0000")
    with pytest.raises(RunNotFound):
        store.get_note(TENANT, "run-none", first.id)
    before = snapshot(store, run)
    with pytest.raises(Conflict):
        store.post_note(TENANT, run.id, first.model_copy(update={"text": "again"}))
    assert store.get_inbox(TENANT, run.id, 1)[0].text == "I covered tides" and snapshot(store, run) == before


def test_a_note_to_no_step_or_no_run_is_refused(store: Store) -> None:
    run = new_run(store)
    with pytest.raises(NotFound):
        store.post_note(TENANT, run.id, message(run.id, 9, "nobody"))
    with pytest.raises(RunNotFound):
        store.post_note(TENANT, "run-none", message("run-none", 0, "nobody"))
    with pytest.raises(RunNotFound):
        store.get_inbox(TENANT, "run-none")
    assert store.get_inbox(TENANT, run.id) == []
    with pytest.raises(RunNotFound):
        store.get_inbox("other-tenant", run.id)


def test_a_note_is_masked_before_it_is_written(store: Store) -> None:
    store.redactor.add("TRACKER_TOKEN", "sk-secret-value-123")
    run = new_run(store)
    store.post_note(TENANT, run.id, message(run.id, 1, "the key is sk-secret-value-123"))
    q = question(run.id, 0, "use sk-secret-value-123?")
    store.post_note(TENANT, run.id, q)
    store.answer_question(TENANT, run.id, q.id, "yes, sk-secret-value-123", at=utcnow())
    texts = [(n.text, n.answer) for n in store.get_inbox(TENANT, run.id)]
    assert "sk-secret-value-123" not in repr(texts) and "[TRACKER_TOKEN]" in repr(texts)


def test_a_question_is_answered_once_and_an_expired_one_refuses_its_answer(store: Store) -> None:
    run = new_run(store)
    q, late = question(run.id, 0, "which coast?"), question(run.id, 1, "which year?")
    store.post_note(TENANT, run.id, q)
    store.post_note(TENANT, run.id, late)
    assert [n.id for _, n in store.list_open_questions(TENANT)] == [q.id, late.id]
    answered = store.answer_question(TENANT, run.id, q.id, "the north", at=utcnow())
    assert answered.status == QuestionStatus.answered and answered.answer == "the north"
    assert store.get_inbox(TENANT, run.id, 0)[0] == answered
    with pytest.raises(Conflict, match="answered, not open"):
        store.answer_question(TENANT, run.id, q.id, "the south", at=utcnow())
    assert store.close_question(TENANT, run.id, q.id) == answered  # the answer stands
    assert store.close_question(TENANT, run.id, late.id).status == QuestionStatus.expired
    with pytest.raises(Conflict, match="expired, not open"):
        store.answer_question(TENANT, run.id, late.id, "1999", at=utcnow())
    assert store.list_open_questions(TENANT) == [] and store.list_open_questions() == []
    with pytest.raises(NotFound):
        store.answer_question(TENANT, run.id, "q-0000", "?", at=utcnow())
    msg = message(run.id, 0, "not a question")
    store.post_note(TENANT, run.id, msg)
    with pytest.raises(NotFound):
        store.close_question(TENANT, run.id, msg.id)


def test_open_questions_of_all_tenants_name_their_tenant(store: Store) -> None:
    mine, theirs = new_run(store), new_run(store, tenant="acme")
    store.post_note(TENANT, mine.id, question(mine.id, 0, "a?"))
    store.post_note("acme", theirs.id, question(theirs.id, 0, "b?"))
    assert sorted(t for t, _ in store.list_open_questions()) == ["acme", TENANT]
    assert [n.text for _, n in store.list_open_questions("acme")] == ["b?"]


def test_an_answer_and_the_end_of_the_wait_race_and_exactly_one_wins(store: Store) -> None:
    run = new_run(store)
    for _ in range(5):
        _race_answer_and_close(store, run)


def _race_answer_and_close(store: Store, run: Run) -> None:
    q = question(run.id, 0, "now?")
    store.post_note(TENANT, run.id, q)
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def answer() -> None:
        barrier.wait()
        try:
            outcomes.append(store.answer_question(TENANT, run.id, q.id, "yes", at=utcnow()).status)
        except Conflict:
            outcomes.append("refused")

    def close() -> None:
        barrier.wait()
        outcomes.append(("closed", store.close_question(TENANT, run.id, q.id).status))

    threads = [threading.Thread(target=answer), threading.Thread(target=close)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    final = next(n for n in store.get_inbox(TENANT, run.id, 0) if n.id == q.id)
    if final.status == QuestionStatus.answered:
        assert QuestionStatus.answered in outcomes and ("closed", QuestionStatus.answered) in outcomes
    else:
        assert "refused" in outcomes and ("closed", QuestionStatus.expired) in outcomes


def test_what_an_attempt_observed_is_kept_per_attempt_and_fenced(store: Store) -> None:
    run = new_run(store)
    first, ref = claim(store, run, 1)
    store.observe(ref, ["m-1", "m-2"])
    store.observe(ref, ["q-1.answer"])
    store.observe(ref, [])
    assert store.get_observed(TENANT, run.id, 1) == {1: ["m-1", "m-2", "q-1.answer"]}
    assert store.get_observed(TENANT, run.id, 0) == {}
    store.end_attempt(ref, AttemptStatus.interrupted)
    before = snapshot(store, run)
    with pytest.raises(AttemptEnded):
        store.observe(ref, ["m-3"])
    assert store.get_observed(TENANT, run.id, 1) == {1: ["m-1", "m-2", "q-1.answer"]} and snapshot(store, run) == before
    wrong = ref.model_copy(update={"token": "not-the-token"})
    with pytest.raises(AttemptEnded):
        store.observe(wrong, ["m-3"])


def test_delivery_is_exactly_once_per_step_across_its_attempts(store: Store) -> None:
    """An attempt interrupted before it saw a message gets it on resume; one that saw it is
    not sent it twice (the rule over what the store keeps)."""
    run = new_run(store)
    seen_first, unseen = message(run.id, 1, "seen by attempt 1"), message(run.id, 1, "arrived after")
    store.post_note(TENANT, run.id, seen_first)
    _, ref = claim(store, run, 1)
    pending = undelivered(store.get_inbox(TENANT, run.id, 1), set(), 1)
    store.observe(ref, [n.delivery_id for n in pending])
    store.post_note(TENANT, run.id, unseen)
    store.end_attempt(ref, AttemptStatus.interrupted)
    _, again = claim(store, run, 1, expect_status=("running",))
    seen = {i for ids in store.get_observed(TENANT, run.id, 1).values() for i in ids}
    assert [n.id for n in undelivered(store.get_inbox(TENANT, run.id, 1), seen, 1)] == [unseen.id]
    assert again.n == 2
