"""The on-end hook: told about every run that ends, by its own drive or by reconcile
(reconcile's step 5). It settles the run's cost and emits "run finished".

Locally the event is appended to `events.jsonl` beside the store (and given, as JSON on
stdin, to LANEFLOW_ON_END_COMMAND if set); in the cloud it goes to EventBridge.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from pathlib import Path

from laneflow.domain.records import Run, finished_event

log = logging.getLogger("laneflow.hooks")


class LocalOnEnd:
    """Appends "run finished" to a JSON-lines log; runs an optional command with it."""

    _lock = threading.Lock()

    def __init__(self, log_path: str | Path, command: str | None = None):
        self.path = Path(log_path)
        self.command = command

    def __call__(self, run: Run) -> None:
        event = finished_event(run)
        line = json.dumps(event, ensure_ascii=False)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        if self.command:
            try:
                subprocess.run(
                    self.command, shell=True, input=line, text=True, timeout=60, check=False
                )  # the person's own command
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("on-end command failed: %s", type(exc).__name__)
