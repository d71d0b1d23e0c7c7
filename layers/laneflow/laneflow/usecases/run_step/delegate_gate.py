"""The warm gate of delegates: steps whose delegates share an agent, a model and a prefix
read one prefix. A lane's gate holds its siblings until the lead's reply began, but their
delegations come later, each from its own step's turn, and would each write the delegate's
prefix cold. So the first delegation of a run to an agent with a model and a prefix leads
(`Store.gate_claim`): it opens its gate when its delegate's reply begins (or when the
delegate's prefix cannot be cached at all, or it ends); a later delegation to the same
prefix meanwhile waits for that, at most WAIT_S, saying so in its trace, then starts and
reads it.

The first comer leads, not the lane's lead step: which step delegates first, and to whom,
is the model's choice, so a fixed lead could keep the others waiting for a call it never
makes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable

from laneflow.domain.errors import StepStopped
from laneflow.domain.records import EventType
from laneflow.ports import ExecutionSink, Services, StepJob

# A follower waits at most this for the lead delegate's reply to begin (a first token takes
# seconds; a lead whose worker died never opens its gate, and the follower then goes cold).
WAIT_S = 60.0

POLL_S = 0.1


def delegate_gate_key(job: StepJob, tool_names: Iterable[str]) -> str:
    """The gate of a delegate's prefix: its agent, its model and what its prefix holds."""
    digest = hashlib.sha256("\x00".join([job.system_stable, *tool_names]).encode("utf-8")).hexdigest()[:16]
    return f"delegate:{job.agent}:{job.model}:{digest}"


class DelegateGate:
    """One delegation's side of its prefix's gate: `enter` says whether it leads (and, if
    not, returns once the lead's reply began or WAIT_S passed); the lead calls `open`."""

    def __init__(self, svc: Services, job: StepJob, key: str):
        self.svc, self.job, self.key = svc, job, key
        self.lead = False

    def enter(self, sink: ExecutionSink) -> None:
        store, tenant, run_id = self.svc.store, self.job.tenant, self.job.run_id
        claim = store.gate_claim(tenant, run_id, self.key)
        self.lead = claim == "lead"
        if claim != "wait":
            return
        sink.event(
            EventType.gate,
            f"prompt cache: waiting for the first {self.job.agent} delegation's reply to begin, to read its prefix",
            {"gate": self.key},
        )
        started = time.monotonic()
        while time.monotonic() - started < WAIT_S:
            if sink.stopped():
                raise StepStopped("stopped by a person (while its delegate waited for a warm prefix)")
            time.sleep(POLL_S)
            if store.gate_claim(tenant, run_id, self.key) == "open":
                waited = int((time.monotonic() - started) * 1000)
                sink.event(EventType.gate, f"prompt cache: released after {waited} ms", {"gate": self.key, "waited_ms": waited})
                return
        sink.event(
            EventType.warning,
            f"prompt cache: the first {self.job.agent} delegation's reply did not begin within {WAIT_S:g} s; going on cold",
            {"gate": self.key},
        )

    def open(self, *, ended: bool = False) -> None:
        if self.lead:
            self.svc.store.gate_open(self.job.tenant, self.job.run_id, self.key, lead_ended=ended)
