"""`laneflow serve`'s schedules: a daemon thread beside its drives that fires what is due,
every few seconds, with the rules of the cloud (usecases.fire_schedule.tick): one run per
firing, each schedule's overlap policy, and catch-up. The first look is made as serve
starts: a serve that was down fires each schedule's last missed firing if it is at most
`catchup_s` old, and records the others missed. The runs it starts are driven by serve's
own drives."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading

from laneflow.domain.schedules import CATCHUP_S
from laneflow.ports import Services

log = logging.getLogger("laneflow.serve")

LOOK_EVERY_S = 5.0  # Scheduler itself fires within the minute; a look is a read of the enabled schedules


class Scheduling:
    """Fires due schedules of every tenant until stopped. A look that fails is logged and
    the next one comes on time."""

    def __init__(self, svc: Services, *, catchup_s: float = CATCHUP_S, interval_s: float = LOOK_EVERY_S, quiet: bool = False):
        self.svc, self.catchup_s, self.interval_s, self.quiet = svc, catchup_s, interval_s, quiet
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="laneflow-schedules", daemon=True)
        self.looks = 0

    def start(self) -> Scheduling:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def look(self, now: dt.datetime | None = None) -> None:
        """One look: fire what is due now."""
        from laneflow.usecases.fire_schedule import tick

        for fired in tick(self.svc, now or dt.datetime.now(dt.UTC), catchup_s=self.catchup_s):
            if not self.quiet:
                print(f"laneflow serve: schedule {fired.line()}", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.look()
            except Exception:  # the next look tries again
                log.exception("laneflow serve: a look at the schedules failed")
            self.looks += 1
            self._stopping.wait(self.interval_s)
