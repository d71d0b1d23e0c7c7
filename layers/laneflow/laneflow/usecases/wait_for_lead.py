"""The warm gate (README, "The warm gate"): a lane's siblings start only once its lead's model
response has begun, so they read the prompt prefix the lead wrote instead of each writing it.

In the definition a sibling's Map iteration waits in WaitForLead on a callback token; the
lead's RunStep completes the tokens when its stream's first event arrives, or when it ends
without one. The handshake is a rendezvous in the store (`gate_wait` / `gate_open`):
whichever side arrives second completes the token, in both engines alike.
"""

from __future__ import annotations

import logging

from laneflow.domain.lanes import gate_key, waiting_line
from laneflow.domain.messages import LaneKey, WaitForLeadReport, WaitForLeadRequest
from laneflow.domain.records import Event, EventType, utcnow
from laneflow.ports import Services, TokenGone

log = logging.getLogger("laneflow.gate")



def wait_for_lead(svc: Services, req: WaitForLeadRequest) -> WaitForLeadReport:
    """A sibling arrives: go on at once if its lead's reply has begun, else leave its token
    for the lead (and say so in its trace). It holds no worker while it waits."""
    tenant, run_id = req.run.tenant, req.run.run_id
    key = gate_key(req.group, req.cycle, req.lane)
    if svc.store.gate_wait(tenant, run_id, key, req.token):
        svc.callbacks.succeed(req.token, {"released": "the lead's reply had already begun"})
        return WaitForLeadReport(index=req.step.index, waiting=False)
    agent = LaneKey.parse(req.lane).agent
    svc.store.add_event(tenant, run_id, req.step.index, Event(type=EventType.gate, text=waiting_line(agent)))
    return WaitForLeadReport(index=req.step.index, waiting=True)



def open_gate(
    svc: Services, tenant: str, run_id: str, *, group: int, cycle: int, lane: str, lead: int, why: str, at: str | None = None
) -> int:
    """The lead's reply began, or it ended (or will not run) without one: release every
    sibling waiting so far; later arrivals find the gate open. Idempotent. Returns how many
    waiting siblings this call released."""
    tokens = svc.store.gate_open(tenant, run_id, gate_key(group, cycle, lane))
    released = 0
    for token in tokens:
        try:
            svc.callbacks.succeed(token, {"released": why})
            released += 1
        except TokenGone:
            log.info("gate %s: a sibling's token was already gone", lane)
    if tokens:
        data = {"opened_at": at or utcnow(), "released_at": utcnow(), "released": released}
        svc.store.add_event(
            tenant, run_id, lead, Event(type=EventType.gate, text=f"prompt cache: released {released} waiting sibling(s): {why}", data=data)
        )
    return released
