"""The warm gate (README, "The warm gate"): a lane's siblings start only once its lead's model
response has begun, so they read the prompt prefix the lead wrote instead of each writing it.

In the definition a sibling's Map iteration waits in WaitForLead on a callback token; the
lead's RunStep completes the tokens when its stream's first event arrives, or when it ends
without one. The handshake is a rendezvous in the store (`gate_wait` / `gate_open`):
whichever side arrives second completes the token, in both engines alike.

The gate never lowers the lane's concurrency: the siblings' Map runs `parallel` at a time,
and one of them, the reserve (laneflow.domain.gate), waits until the lead has ended, so the
lead and its siblings together never run more than `parallel` at once. Where the lead's
prefix cannot be cached at all, it opens the gate before its model call, with a note that
every sibling's trace then carries.
"""

from __future__ import annotations

import logging

from laneflow.domain.gate import is_reserve, reserve_line
from laneflow.domain.lanes import gate_id, gate_key, waiting_line
from laneflow.domain.messages import LaneKey, WaitForLeadReport, WaitForLeadRequest
from laneflow.domain.records import Event, EventType, utcnow
from laneflow.ports import Services

log = logging.getLogger("laneflow.gate")


def wait_at_gate(svc: Services, req: WaitForLeadRequest) -> WaitForLeadReport:
    """The WaitForLead function: a sibling waits for its lead (`wait_for_lead`); a lead or a
    lone step (WaitForPrefix) for another run's writer of its prefix (usecases.prefix_gate)."""
    if req.step.role == "sibling":
        return wait_for_lead(svc, req)
    from laneflow.usecases.prefix_gate import wait_for_prefix  # it builds the step's prompt

    return wait_for_prefix(svc, req)


def wait_for_lead(svc: Services, req: WaitForLeadRequest) -> WaitForLeadReport:
    """A sibling arrives: go on at once if its lead's reply has begun (the reserve: if its
    lead has ended), else leave its token for the lead (and say so in its trace). It holds
    no worker while it waits."""
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    key = gate_key(req.group, req.cycle, req.lane)
    reserve = is_reserve(req.map_index, req.parallel)
    passed = svc.store.gate_wait(tenant, run_id, key, req.token, index=index, until_lead_ends=reserve)
    if passed is not None:
        if passed.note and not reserve:
            svc.store.add_event(tenant, run_id, index, Event(type=EventType.gate, text=passed.note))
        svc.callbacks.succeed(req.token, {"released": "the gate was already open"})
        return WaitForLeadReport(index=index, waiting=False)
    agent = LaneKey.parse(req.lane).agent
    line = reserve_line(agent, req.parallel or 0) if reserve else waiting_line(agent)
    svc.store.add_event(tenant, run_id, index, Event(type=EventType.gate, text=line))
    return WaitForLeadReport(index=index, waiting=True)


def open_gate(
    svc: Services,
    tenant: str,
    run_id: str,
    *,
    group: int,
    cycle: int,
    lane: str,
    lead: int,
    why: str,
    at: str | None = None,
    lead_ended: bool = False,
    note: str | None = None,
) -> int:
    """The lead's reply began, or it ended (or will not run) without one, or its prefix
    cannot be cached (`note` says so): release every sibling waiting so far for its reply;
    with `lead_ended`, the reserve waiting for its pool slot too. Later arrivals find the
    gate open. Idempotent. Returns how many waiting siblings this call released."""
    key = gate_key(group, cycle, lane)
    waiters = svc.store.gate_open(tenant, run_id, key, lead_ended=lead_ended, note=note)
    released = 0
    # The output names the gate: an engine that readied the waiting siblings (the embedded
    # one's early starts) lets their held requests go by it.
    output = {"released": why, "gate": gate_id(tenant, run_id, key), "replied": not lead_ended}
    gone = set(svc.callbacks.succeed_all([w.token for w in waiters], output)) if waiters else set()
    for waiter in waiters:
        if waiter.token in gone:
            log.info("gate %s: a sibling's token was already gone", lane)
            continue
        released += 1
        if note and waiter.index is not None and not waiter.until_lead_ends:
            svc.store.add_event(tenant, run_id, waiter.index, Event(type=EventType.gate, text=note))
    if waiters:
        data = {"ended_at" if lead_ended else "opened_at": at or utcnow(), "released_at": utcnow(), "released": released}
        svc.store.add_event(
            tenant,
            run_id,
            lead,
            Event(type=EventType.gate, text=f"prompt cache: released {released} waiting sibling(s): {why}", data=data),
        )
    return released
