"""A local engine's watch over the prefix records its waiting steps wait on.

A step of this process's engine waiting for another run's writer (WaitForPrefix) is handed
back by that writer when its reply begins, but only if the writer runs in this process: a
token is known to the engine that made it. Several `laneflow run` processes, or `serve`
drives, share one store and not one engine, so this watch looks at the records of the
tokens it was given (one thread, every POLL_S) and completes a token itself once its prefix
is written (warm), its writer released it, or the wait reached its cap (WRITER_WAIT_S). A
token completed twice is harmless: the second completion finds it gone."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from laneflow.domain.prefixes import WRITER_WAIT_S
from laneflow.ports import Store, TaskCallbacks

log = logging.getLogger("laneflow.gate")

POLL_S = 0.05


@dataclass(frozen=True)
class _Watched:
    tenant: str
    key: str
    token: str
    deadline: float  # monotonic


class LocalPrefixWatch:
    def __init__(self, store: Store, callbacks: TaskCallbacks, now: Callable[[], float], poll_s: float = POLL_S):
        self._store, self._callbacks, self._now, self._poll = store, callbacks, now, poll_s
        self._lock = threading.Lock()
        self._watched: list[_Watched] = []
        self._thread: threading.Thread | None = None

    def watch(self, tenant: str, key: str, token: str) -> None:
        with self._lock:
            self._watched.append(_Watched(tenant, key, token, time.monotonic() + WRITER_WAIT_S))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="laneflow-prefix-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._poll)
            with self._lock:
                watched = list(self._watched)
                if not watched:
                    self._thread = None
                    return
            done = [w for w in watched if self._released(w)]
            for w in done:
                try:
                    self._callbacks.succeed(w.token, {"released": "its prefix was written, released, or waited for long enough"})
                except Exception:  # gone: its writer (or the cap) completed it already
                    pass
            with self._lock:
                self._watched = [w for w in self._watched if w not in done]

    def _released(self, w: _Watched) -> bool:
        if time.monotonic() >= w.deadline:
            return True
        try:
            record = self._store.get_prefix(w.tenant, w.key)
        except Exception:
            log.debug("prefix %s: its record could not be read", w.key, exc_info=True)
            return False
        return record is None or not record.keeps_waiting(self._now())
