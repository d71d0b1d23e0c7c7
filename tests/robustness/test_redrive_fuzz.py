"""`POST /runs/{run_id}/redrive` given arbitrary run ids, bodies, headers and callers: never a
5xx, never a traceback; a 200 only for the caller's own failed run with a body it takes (none,
or `{}`), and a refusal writes nothing."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import write_workspace
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.domain.records import RunChanges, RunStatus
from laneflow.entrypoints.api import resolve
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine, open_store
from robustness.test_api_fuzz import HEADER_NAMES, HEADER_VALUES, TENANT, NoDrives, bodies, event

ACCEPTED = (None, "", "{}", "null", " {} ")


@pytest.fixture(scope="module")
def failed() -> Iterator[tuple[Services, str]]:
    folder = Path(tempfile.mkdtemp(prefix="redrive-fuzz-"))
    svc = for_store(open_store(f"sqlite:///{folder}/laneflow.db"), Settings(capture_dir=f"{folder}/captures"))
    ws = write_workspace(folder / "ws", {"failer": {"stub": "fail: no"}}, {"one": {"steps": [{"agent": "failer"}]}})
    run = create_run(svc, ws, "one", tenant=TENANT)
    assert local_engine(svc).drive(TENANT, run.id, tick_s=0.02).run.status == RunStatus.failed
    svc.drives = NoDrives()
    yield svc, run.id
    svc.store.close()
    shutil.rmtree(folder)


def ids(real: str) -> st.SearchStrategy[str]:
    return st.sampled_from([real, real.upper(), "run-nope", "x" * 129, "x" * 200, "%2e%2e", "..", "a b", "é", "a/b"]) | st.text(
        max_size=20
    )


def state(svc: Services, run_id: str) -> dict[str, Any]:
    """The run as stored, its times left out (a redrive writes them, a refusal nothing)."""
    return svc.store.get_run(TENANT, run_id).model_dump(mode="json", exclude={"created_at"})


@settings(max_examples=200)
@given(data=st.data())
def test_any_redrive_request_is_answered_below_500_and_a_refusal_writes_nothing(
    failed: tuple[Services, str], data: st.DataObject
) -> None:
    svc, real = failed
    run_id = data.draw(ids(real))
    body = data.draw(st.sampled_from(ACCEPTED) | bodies())
    headers = {"Content-Type": "application/json", **data.draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=3))}
    caller = data.draw(st.sampled_from([TENANT, TENANT, "globex", "bad#tenant", ""]))
    request = event("POST", f"/runs/{run_id}/redrive", headers, body)
    request["requestContext"]["identity"]["accountId"] = caller or None
    before = state(svc, real)

    out = resolve(request, None, svc)

    status, answer = out["statusCode"], str(out.get("body") or "")
    assert status < 500, (status, answer)
    assert "Traceback" not in answer and 'File "' not in answer
    if status == 200:
        assert (run_id, caller) == (real, TENANT) and json.loads(answer)["redrives"] == before["redrives"] + 1
        # Failed again, so the next example may be answered 200 too.
        svc.store.update_run(TENANT, real, RunChanges(status=RunStatus.failed, error="failed again"))
        return
    assert status in (400, 401, 404, 405, 409), (status, answer)
    assert state(svc, real) == before
    if run_id == real and caller == TENANT and body in ACCEPTED:
        raise AssertionError(f"the caller's failed run was refused: {answer}")
