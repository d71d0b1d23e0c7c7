"""The warm gate (README, "The warm gate") through the real definition on the embedded engine.

Times come from the record: a step's `started_at` is its claim, the lead's release is the
gate event it writes when its stream's first event arrives (stub `ttft_ms`)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from helpers import FIXTURES, FlowRunner, ServicesOn

from laneflow.adapters.workers import local_worker
from laneflow.domain.gate import reserve_line
from laneflow.domain.lanes import waiting_line
from laneflow.domain.records import AttemptStatus, RunStatus, Step, StepStatus
from laneflow.ports import Services
from laneflow.usecases.run_step.runner import WAITED_TO_START
from laneflow.usecases.start_run import create_run

GATE = FIXTURES / "ws_gate"


def ts(text: str | None) -> dt.datetime:  # a timestamp the test expects set
    assert text is not None, "a timestamp is missing"
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def released_at(step: Step) -> dt.datetime:
    """When the lead released the siblings waiting for its reply (the first release it wrote;
    a second one, at its end, is the reserve's)."""
    return ts([e for e in step.events if e.type == "gate" and "released" in e.text][0].t)


def test_the_lead_starts_first_and_no_sibling_starts_before_its_first_stream_event(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "fanout").run
    assert run.status == RunStatus.completed
    lead, *siblings = run.steps
    first_event = ts(lead.started_at) + dt.timedelta(milliseconds=250)  # the stub's ttft_ms
    assert released_at(lead) >= first_event
    for sibling in siblings:
        assert ts(sibling.started_at) >= first_event, f"step {sibling.index} started before the lead's reply began"
        assert ts(sibling.started_at) - released_at(lead) < dt.timedelta(milliseconds=500)


def test_each_waiting_sibling_says_so_in_its_trace(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "fanout").run
    lead, *siblings = run.steps
    assert not any(e.text == waiting_line("quick") for e in lead.events)
    for sibling in siblings:
        gate_lines = [e for e in sibling.events if e.type == "gate"]
        assert [e.text for e in gate_lines] == [
            "prompt cache: waiting for the first quick step's reply before starting, so this one reads its prefix"
        ]
        assert ts(gate_lines[0].t) <= ts(sibling.started_at)
    assert "released 3 waiting sibling(s): the lead's reply began" in [e.text for e in lead.events if e.type == "gate"][0]


def test_a_lead_that_fails_before_replying_releases_its_siblings(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "lead_fails").run
    assert run.status == RunStatus.completed  # everyone recovers on the retry
    lead, *siblings = run.steps
    release = [e.text for e in lead.events if e.type == "gate"]
    assert release == ["prompt cache: released 2 waiting sibling(s): the lead's attempt 1 failed before its reply began"]
    # released at the lead's first failure, not after its retry
    for sibling in siblings:
        assert ts(sibling.started_at) < ts(lead.finished_at)


def test_a_stop_while_siblings_wait_skips_them_never_started(svc: Services, run_flow: FlowRunner) -> None:
    engine = run_flow.engine
    run = create_run(svc, GATE, "stop")

    def stop_once_siblings_wait() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            steps = svc.store.get_run(run.tenant, run.id).steps
            lead_running = steps[0].status == StepStatus.running
            if lead_running and all(any(e.type == "gate" for e in s.events) for s in steps[1:3]):
                svc.store.request_stop(run.tenant, run.id)
                return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_once_siblings_wait)
    stopper.start()
    result = engine.drive(run.tenant, run.id, tick_s=0.02)
    stopper.join()
    final = result.run
    assert final.status == RunStatus.failed and final.finished_at and final.stop_requested
    lead, s1, s2, later = final.steps
    assert lead.status == StepStatus.failed and lead.error == "stopped by a person"
    # The stop ended the slow lead: its 40 s model call never answered
    [attempt] = svc.store.list_attempts(run.tenant, run.id, lead.index)
    assert attempt.status == AttemptStatus.stopped and lead.calls == [] and lead.result is None
    for sibling in (s1, s2):
        assert sibling.status == StepStatus.skipped and sibling.skip_reason == WAITED_TO_START
        assert sibling.attempts == 0 and sibling.started_at is None
    assert later.status == StepStatus.skipped and later.skip_reason == "run stopped"


def test_two_lanes_in_one_group_proceed_independently(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "two_lanes").run
    quick = [s for s in run.steps if s.agent == "quick"]
    slow = [s for s in run.steps if s.agent == "slow"]
    slow_release = released_at(slow[0])
    quick_release = released_at(quick[0])
    assert quick_release < slow_release - dt.timedelta(milliseconds=500)
    for sibling in quick[1:]:
        assert ts(sibling.started_at) < slow_release, "a quick sibling waited for the slow lane's lead"
    for sibling in slow[1:]:
        assert ts(sibling.started_at) >= slow_release


def test_parallel_still_caps_a_gated_lane(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "capped").run
    assert run.status == RunStatus.completed
    spans = sorted((cast(str, s.started_at), cast(str, s.finished_at)) for s in run.steps)
    assert max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans) == 2


def test_a_lone_step_has_no_gate(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "lone").run
    assert run.status == RunStatus.completed
    assert not any(e.type == "gate" for s in run.steps for e in s.events)


def test_the_gate_can_be_turned_off_for_comparison(run_flow: FlowRunner) -> None:
    run = run_flow(GATE, "fanout", options={"gate": False}).run
    assert run.status == RunStatus.completed
    assert not any(e.type == "gate" for s in run.steps for e in s.events)
    # No sibling waited at a gate (no gate line above, which a wait writes), and they ran
    # together: every step had started before any ended
    assert max(ts(s.started_at) for s in run.steps) < min(ts(s.finished_at) for s in run.steps)


def test_the_gate_rendezvous_completes_a_token_whichever_side_arrives_second(svc: Services, tmp_path: Path) -> None:
    """The store handshake: sibling first (kept, later handed to the lead) or lead first
    (the sibling is told the gate is open); a token is handed back only once."""
    run = create_run(svc, GATE, "fanout")
    store, t, r = svc.store, run.tenant, run.id
    assert store.gate_wait(t, r, "g0c0:quick@stub", "tok-1") is None
    assert store.gate_wait(t, r, "g0c0:quick@stub", "tok-2") is None
    assert [w.token for w in store.gate_open(t, r, "g0c0:quick@stub")] == ["tok-1", "tok-2"]
    assert store.gate_open(t, r, "g0c0:quick@stub") == []
    assert store.gate_wait(t, r, "g0c0:quick@stub", "tok-3") is not None
    assert store.gate_open(t, r, "g0c0:quick@stub") == []
    # another lane's gate is its own
    assert store.gate_wait(t, r, "g0c0:other@stub", "tok-4") is None


def test_a_lead_that_will_not_run_after_all_still_opens_the_gate(svc: Services) -> None:
    """The run is stopped while the lead waits to start: the lead is skipped, never started,
    and still releases the sibling already waiting, so no sibling waits forever."""
    from laneflow.domain.messages import LaneStep, RunStepRequest, StartDriveRequest, WaitForLeadRequest
    from laneflow.usecases.run_step.runner import run_step
    from laneflow.usecases.start_drive import start_drive
    from laneflow.usecases.wait_for_lead import wait_for_lead

    completed: list[str] = []

    class Callbacks:
        def succeed(self, token: str, output: dict[str, Any]) -> None:
            completed.append(token)

        def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
            completed.extend(tokens)
            return []

        def fail(self, token: str, error: str, cause: str) -> None:  # pragma: no cover - not expected
            raise AssertionError(error)

    svc.callbacks = Callbacks()  # type: ignore[assignment]  # a partial fake: no heartbeat
    run = create_run(svc, GATE, "fanout")
    ref = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id), worker=local_worker())
    lane = "quick@stub"
    waiting = wait_for_lead(
        svc, WaitForLeadRequest(run=ref, group=0, lane=lane, step=LaneStep(index=1, role="sibling"), token="tok-1")
    )
    assert waiting.waiting and completed == []
    svc.store.request_stop(run.tenant, run.id)
    report = run_step(
        svc, RunStepRequest(run=ref, group=0, lane=lane, step=LaneStep(index=0, role="lead")), worker=local_worker()
    )
    assert report.status == StepStatus.skipped and report.attempts == 0
    assert completed == ["tok-1"]


def _most_at_once(spans: list[tuple[dt.datetime, dt.datetime]]) -> int:
    return max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)


@pytest.mark.slow
def test_a_gated_lane_runs_parallel_steps_at_once_and_takes_about_the_ideal_time(run_flow: FlowRunner) -> None:
    """12 stub steps of 2 s at `parallel: 3` (reply after 200 ms): from the steps' recorded
    start and end times, never more than 3 run at once, and the reserve said why it waited
    for the lead's end. (The makespan against the ideal is bench/gated_lane.py's figure.)"""
    run = run_flow(GATE, "lane12").run
    assert run.status == RunStatus.completed
    spans = sorted((ts(s.started_at), ts(s.finished_at)) for s in run.steps)
    assert _most_at_once(spans) == 3
    lead, *siblings = run.steps
    reserve = siblings[2]  # the siblings' Map iteration parallel - 1
    lines = [e.text for e in reserve.events if e.type == "gate"]
    assert lines == [reserve_line("steady", 3)]
    assert ts(reserve.started_at) >= ts(lead.finished_at)
    # Once the lead has ended, the lane runs 3 siblings at once, not 2.
    after = [(a, b) for a, b in spans if a >= ts(lead.finished_at)]
    assert _most_at_once(after) == 3
    assert [e.text for e in lead.events if e.type == "gate"][-1] == "prompt cache: released 1 waiting sibling(s): the lead ended"


class _Completed:
    """The callbacks port, keeping the tokens completed (in order)."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        self.tokens.append(token)

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        self.tokens.extend(tokens)
        return []

    def fail(self, token: str, error: str, cause: str) -> None:  # pragma: no cover - not expected
        raise AssertionError(error)


def test_the_reserve_waits_through_the_lead_s_reply_and_goes_when_its_worker_crashes(on: ServicesOn) -> None:
    """The siblings' Map iteration parallel - 1 waits for the lead's end: the reply releases
    the others only; the lead's StepCrashed (its worker died) releases the reserve, and the
    reserve's trace says what it waited for."""
    from laneflow.domain.messages import LaneStep, StartDriveRequest, StepCrashedRequest, WaitForLeadRequest
    from laneflow.usecases.start_drive import start_drive
    from laneflow.usecases.step_crashed import step_crashed
    from laneflow.usecases.wait_for_lead import open_gate, wait_for_lead

    svc = on()
    svc.callbacks = completed = _Completed()  # type: ignore[assignment]  # a partial fake: no heartbeat
    run = create_run(svc, GATE, "fanout")
    ref = start_drive(svc, StartDriveRequest(tenant=run.tenant, run_id=run.id), worker=local_worker())
    lane = "quick@stub"

    def arrive(index: int, map_index: int) -> bool:
        req = WaitForLeadRequest(
            run=ref,
            group=0,
            lane=lane,
            step=LaneStep(index=index, role="sibling"),
            token=f"tok-{index}",
            map_index=map_index,
            parallel=2,
        )
        return wait_for_lead(svc, req).waiting

    assert arrive(1, 0) and arrive(2, 1)  # iteration 1 of a lane at parallel 2 is the reserve
    open_gate(svc, run.tenant, run.id, group=0, cycle=0, lane=lane, lead=0, why="the lead's reply began")
    assert completed.tokens == ["tok-1"]
    assert not arrive(3, 2)  # a later iteration, after the reply: at once
    step_crashed(
        svc,
        StepCrashedRequest(run=ref, step=LaneStep(index=0, role="lead"), group=0, lane=lane, error={"Error": "Lambda.Timeout"}),
    )
    assert completed.tokens == ["tok-1", "tok-3", "tok-2"]
    reserve = svc.store.get_step(run.tenant, run.id, 2, detail=True)
    assert [e.text for e in reserve.events if e.type == "gate"] == [reserve_line("quick", 2)]


def test_an_older_database_s_gate_gains_the_lead_s_end_and_its_bare_tokens_still_come_back(tmp_path: Path) -> None:
    """A database made before the gate knew the lead's end (schema 5: bare tokens, no
    ended_at or note) is upgraded on open, and a token it kept is still handed back."""
    import sqlite3

    from laneflow.adapters.store import open_store
    from laneflow.domain.gate import GateWaiter

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE gates (tenant TEXT NOT NULL, run_id TEXT NOT NULL, key TEXT NOT NULL, opened_at TEXT,"
        " tokens TEXT NOT NULL DEFAULT '[]', PRIMARY KEY (tenant, run_id, key)) WITHOUT ROWID"
    )
    db.execute("""INSERT INTO gates VALUES ('local', 'run-1', 'g0c0:quick@stub', NULL, '["tok-old"]')""")
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    store = open_store(f"sqlite:///{path}")
    assert store.gate_wait("local", "run-1", "g0c0:quick@stub", "tok-new", index=2, until_lead_ends=True) is None
    assert store.gate_open("local", "run-1", "g0c0:quick@stub", note="n") == [GateWaiter(token="tok-old")]
    assert store.gate_open("local", "run-1", "g0c0:quick@stub", lead_ended=True) == [
        GateWaiter(token="tok-new", index=2, until_lead_ends=True)
    ]
