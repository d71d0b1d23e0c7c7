"""Reading a record from the JSON a store keeps keeps none of its values in the process:
pydantic-core's string cache (16,384 strings, process-wide) kept every id, time and item it
read, so a long-lived process (`laneflow serve`) filled it run after run. Only field names
are cached (`records.READ_JSON`); a value read is held by its record alone."""

from __future__ import annotations

import gc
import json
import sys
import uuid
from pathlib import Path

from helpers import write_workspace

from laneflow.adapters.store import open_store, rulebook_runs, sqlite
from laneflow.domain import workers
from laneflow.domain.inbox import Note
from laneflow.domain.records import Attempt
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store


def _held_by_caller_only(value: str) -> bool:
    """Whether nothing but the caller's one name for `value` (and this call) holds it."""
    gc.collect()
    fresh = uuid.uuid4().hex  # held by this name only
    return sys.getrefcount(value) == sys.getrefcount(fresh) + 1  # + the caller's name


def test_the_check_sees_a_value_something_else_holds() -> None:
    value, kept = uuid.uuid4().hex, []
    assert _held_by_caller_only(value)
    kept.append(value)
    assert not _held_by_caller_only(value)


def test_an_attempt_a_note_a_run_input_and_a_worker_read_from_json_leave_no_value_behind() -> None:
    doc = {"run_id": "", "index": 0, "n": 1, "token": "t", "started_at": "2026-01-01T00:00:00.000Z"}
    for read in (
        lambda text: Attempt.model_validate_json(text),
        lambda text: sqlite._ATTEMPTS.validate_json(f"[{text}]")[0],
    ):
        doc["run_id"] = uuid.uuid4().hex  # a value this process never read before
        attempt = read(json.dumps(doc))  # type: ignore[no-untyped-call]
        value = attempt.run_id
        del attempt
        assert _held_by_caller_only(value)
    note = Note.model_validate_json(
        json.dumps({"id": uuid.uuid4().hex, "run_id": "r", "kind": "message", "to_index": 1, "text": "hi"})
    )
    value = note.id
    del note
    assert _held_by_caller_only(value)
    run_input = rulebook_runs._RunInput.model_validate_json(json.dumps({"input": {"items": [uuid.uuid4().hex]}}))
    value = run_input.input["items"][0]  # the store keeps a few inputs parsed, by run: not their items for ever
    del run_input
    assert _held_by_caller_only(value)
    ref = workers.loads(json.dumps({"kind": "local", "host": uuid.uuid4().hex, "pid": 1}))
    assert isinstance(ref, workers.LocalProcess)
    value = ref.host
    del ref
    assert _held_by_caller_only(value)


def test_a_run_and_its_steps_read_from_the_store_leave_no_value_behind(tmp_path: Path) -> None:
    ws = write_workspace(
        tmp_path / "ws",
        {"worker": {"stub": "Done."}},
        {"fan": {"description": "a fan-out", "steps": [{"agent": "worker", "each": "input.items"}]}},
    )
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'a.db'}"))
    created = create_run(svc, ws, "fan", {"items": [uuid.uuid4().hex]})
    run = svc.store.get_run(created.tenant, created.id)  # the run, and its steps as a list
    run_id, item = run.id, run.steps[0].item
    assert run_id == created.id and run_id is not created.id and isinstance(item, str)
    del run
    assert _held_by_caller_only(run_id) and _held_by_caller_only(item)
