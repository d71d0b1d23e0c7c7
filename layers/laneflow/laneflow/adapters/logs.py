"""The process's log records, masked: the log door of the redactors (laneflow.domain.redaction).

The store masks what it writes and its captures share its redactor; this masks, by the
same redactors, every log record the process makes (`redact_logs`, given each redactor
by the wiring as it builds the services) and what the process says outside its records and
logs (`masked`: the CLI's lines on stderr). Three doors, one set of values.
"""

from __future__ import annotations

import logging
import threading
import traceback
import weakref
from typing import Any

from laneflow.domain.redaction import Redactor

# The redactors log records are masked by, held weakly (a store's goes with it). Replaced
# whole under the lock, never changed in place, so a thread logging meanwhile reads a
# consistent tuple.
_LOG_REDACTORS: tuple[weakref.ref[Redactor], ...] = ()

_LOG_LOCK = threading.Lock()

_factory_installed = False


def redact_logs(redactor: Redactor) -> None:
    """Mask `redactor`'s values in every log record this process makes from now on (any
    logger: laneflow's, an SDK's), message, arguments, traceback and stack alike.

    Done where records are made (the record factory), not in a handler: a handler sees only
    the records that reach it, and Lambda's, pytest's and a person's own handlers differ.
    A record that held a secret carries its masked traceback in its message, so every
    formatter shows it and none formats the original exception again."""
    global _LOG_REDACTORS, _factory_installed
    with _LOG_LOCK:
        if not _factory_installed:
            _install_record_factory()
            _factory_installed = True
        live = tuple(ref for ref in _LOG_REDACTORS if ref() is not None)
        if not any(ref() is redactor for ref in live):
            live += (weakref.ref(redactor),)
        _LOG_REDACTORS = live


def _redactors() -> list[Redactor]:
    return [r for ref in _LOG_REDACTORS if (r := ref()) is not None and r]


def masked(text: str) -> str:
    """`text` masked by every redactor `redact_logs` was given: for what a process says
    outside its records and logs (the CLI's lines on stderr)."""
    for redactor in _redactors():
        text = redactor(text)
    return text


def _install_record_factory() -> None:
    made = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = made(*args, **kwargs)
        if _redactors():
            _mask_record(record)
        return record

    logging.setLogRecordFactory(factory)


def _mask_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: leave it for logging to report
        return
    said = masked(message)
    if record.exc_info and record.exc_info[1] is not None:
        shown = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        hidden = masked(shown)
        if hidden != shown:
            said, record.exc_info, record.exc_text = f"{said}\n{hidden}", None, None
    if record.stack_info:
        record.stack_info = masked(record.stack_info)
    if said != message:
        record.msg, record.args = said, None
