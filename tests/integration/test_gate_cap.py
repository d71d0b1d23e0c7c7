"""A gated lane's `parallel:` cap, on the embedded engine through the real definition: the
attempts' own start and end as the store keeps them, never more than the cap running at
once, and the reserve sibling (laneflow.domain.gate) starting only once the lead has ended."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from helpers import FlowRunner, write_workspace

from laneflow.domain.gate import is_reserve, reserve_line
from laneflow.domain.records import AttemptStatus, RunStatus
from laneflow.ports import Services

PARALLEL = 3


def ts(text: str | None) -> dt.datetime:  # a timestamp the test expects set
    assert text is not None, "a timestamp is missing"
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_gated_lane_never_runs_more_than_its_cap_and_its_reserve_waits_for_the_lead_s_end(
    svc: Services, run_flow: FlowRunner, tmp_path: Path
) -> None:
    # Seven short steps (a 100 ms first token, 400 ms in all) at parallel 3
    ws = write_workspace(
        tmp_path / "ws",
        {"brisk": {"stub": "ttft_ms: 100\ndelay_ms: 400\nBrisk {item}.\n"}},
        {
            "lane": {
                "description": "a capped gated lane",
                "steps": [{"agent": "brisk", "each": list("abcdefg"), "parallel": PARALLEL}],
            }
        },
    )
    run = run_flow(ws, "lane").run
    assert run.status == RunStatus.completed, run.error
    attempts = {a.index: a for a in svc.store.list_attempts(run.tenant, run.id)}
    assert sorted(attempts) == list(range(7)) and {a.status for a in attempts.values()} == {AttemptStatus.completed}
    spans = [(ts(a.started_at), ts(a.ended_at)) for a in attempts.values()]

    # At no instant more than the cap running (and the cap reached: the lane does run in parallel)
    running_at = [sum(1 for start, end in spans if start <= t < end) for t, _ in spans]
    assert max(running_at) == PARALLEL, running_at

    # The reserve, by the real rule, is the siblings' iteration PARALLEL - 1; it started only
    # after the lead's attempt ended, and said why it waited
    lead, *siblings = sorted(run.steps, key=lambda s: s.index)
    [reserve] = [s for n, s in enumerate(siblings) if is_reserve(n, PARALLEL)]
    assert ts(attempts[reserve.index].started_at) >= ts(attempts[lead.index].ended_at)
    assert [e.text for e in reserve.events if e.type == "gate"] == [reserve_line("brisk", PARALLEL)]
    # and the other siblings did not wait for the lead's end (the gate opened at its reply)
    others = [s for s in siblings if s is not reserve][: PARALLEL - 1]
    assert all(ts(attempts[s.index].started_at) < ts(attempts[lead.index].ended_at) for s in others)
