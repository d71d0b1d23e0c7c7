"""The colleague tools' inputs (`peers_list`, `peers_message`, `ask`) and the answer route's
body, given arbitrary JSON: a tool's bad input is always its own `ToolError` (an `is_error`
result), never a crash; the route never answers a 5xx, and takes only a non-empty text."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.executors.peers import PeerTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.adapters.store import open_store
from laneflow.domain.inbox import MAX_NOTE_CHARS, Note, NoteKind, QuestionStatus, new_note_id
from laneflow.domain.records import AttemptRef, Run, Step, utcnow
from laneflow.entrypoints.api import resolve
from laneflow.ports import Services, StepJob
from laneflow.settings import Settings
from laneflow.usecases.run_step.inbox import AttemptInbox
from laneflow.wiring import for_store
from robustness.test_api_fuzz import event

TENANT = "acme"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def desk() -> Iterator[tuple[Services, Run]]:
    folder = tempfile.mkdtemp(prefix="peers-fuzz-")
    svc = for_store(open_store(f"sqlite:///{folder}/laneflow.db"), Settings(capture_dir=f"{folder}/captures"))
    run = Run(
        id=f"run-{uuid.uuid4().hex[:8]}",
        tenant=TENANT,
        workspace="w",
        flow="f",
        steps=[Step(index=i, group=0, agent=name, item=None) for i, name in enumerate(("talker", "listener", "scout", "scout"))],
    )
    svc.store.create_run(run)
    yield svc, run
    svc.store.close()
    shutil.rmtree(folder)


def tools_of(svc: Services, run: Run) -> PeerTools:
    attempt = svc.store.claim_attempt(
        TENANT,
        run.id,
        0,
        token=uuid.uuid4().hex,
        started_at=utcnow(),
        expect_status=("pending", "running"),  # type: ignore[arg-type]
    )
    inbox = AttemptInbox(
        svc=svc,
        run=run,
        step=run.steps[0],
        ref=AttemptRef.of(TENANT, attempt),
        agent="talker",
        stopped=lambda: False,
        ask_timeout=0,
        poll_s=0.01,
    )
    job = StepJob(
        tenant=TENANT,
        run_id=run.id,
        index=0,
        attempt=attempt.n,
        agent="talker",
        model="stub",
        item=None,
        run_input=None,
        system_stable="",
        system_dynamic="",
        user="",
        tools=("peers", "ask"),
    )
    return PeerTools(job, SimpleNamespace(inbox=inbox))  # the sink's one attribute the tools read


@pytest.fixture(scope="module")
def tools(desk: tuple[Services, Run]) -> PeerTools:
    return tools_of(*desk)


@given(
    name=st.sampled_from(["peers_list", "peers_message", "ask"]),
    args=st.dictionaries(st.sampled_from(["to", "text", "question", "extra"]) | st.text(max_size=8), json_values, max_size=4),
)
def test_any_input_of_a_colleague_tool_is_its_output_or_its_own_error(tools: PeerTools, name: str, args: dict[str, Any]) -> None:
    try:
        out = tools.run(name, args)
    except ToolError as refused:
        assert str(refused).startswith(f"{name}: ")
        return
    assert isinstance(out, str)
    if name == "peers_message":
        assert args["to"] in ("listener", 1, "1") or str(args["to"]).strip() in ("listener", "1")
        assert isinstance(args["text"], str) and 0 < len(args["text"]) <= MAX_NOTE_CHARS


@given(to=json_values, text=st.text(max_size=50))
def test_a_message_to_anyone_but_one_colleague_is_refused_naming_the_choices(tools: PeerTools, to: Any, text: str) -> None:
    try:
        tools.run("peers_message", {"to": to, "text": text})
    except ToolError as refused:
        said = str(refused)
        assert "colleagues are" in said or "non-empty" in said or "itself" in said or "index" in said or "NUL" in said
        return
    assert str(to).strip() in ("listener", "1")


@pytest.fixture(scope="module")
def asked(desk: tuple[Services, Run]) -> tuple[Services, Run]:
    svc, run = desk
    note = Note(
        id=new_note_id(NoteKind.question),
        run_id=run.id,
        kind=NoteKind.question,
        to_index=1,
        from_index=1,
        from_agent="listener",
        text="which?",
        status=QuestionStatus.open,
    )
    svc.store.post_note(TENANT, run.id, note)
    return svc, run


@given(body=json_values | st.text(max_size=30), index=st.sampled_from(["1", "0", "9", "-1", "x", "01", "99999999999"]))
def test_the_answer_route_never_fails_and_takes_only_a_non_empty_text(asked: tuple[Services, Run], body: Any, index: str) -> None:
    svc, run = asked
    raw = body if isinstance(body, str) else json.dumps(body)
    path = f"/runs/{run.id}/steps/{index}/answer"
    out = resolve(event("POST", path, {"Content-Type": "application/json"}, raw), None, svc)
    assert out["statusCode"] in (200, 400, 404, 409), out
    said = json.loads(out["body"])
    assert "Traceback" not in out["body"] and "message" in said or out["statusCode"] == 200
    if out["statusCode"] == 200:
        assert isinstance(body, dict) and set(body) == {"text"} and isinstance(body["text"], str) and body["text"]
        assert index in ("1", "01") and said["answer"] == body["text"]
