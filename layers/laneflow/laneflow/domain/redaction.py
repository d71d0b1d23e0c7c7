"""Keeping secrets and local paths out of what is recorded.

`Redactor` masks secret values (the model's key, declared secrets) as `[NAME]`, longest
first. The store applies its redactor to everything it writes, the captures share it, and
`redact_logs` applies it to the process's log records: three doors, one set of values.
`scrub_paths` removes local filesystem paths from reasons. A capture holds a tool call's
input and output, masked; at most `STEP_CAPTURE_LIMIT` characters per step, after which
no later call of the step is captured (its calls keep names, sizes and times only).
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
import weakref
from enum import Enum
from typing import Any

from pydantic import BaseModel

STEP_CAPTURE_LIMIT = 4_000_000



# Fields of a record that name it (keys, identities, times): never rewritten, so a masked
# record is still found where it was written.
IDENTITY_FIELDS = frozenset({"id", "tenant", "run_id", "token", "op_id", "started_at", "resumed_at", "t", "at"})



class Redactor:
    """Replaces every secret value of 8 characters or more by its name (`[NAME]`), longest
    value first.

    One redactor belongs to a store and is shared by its captures and the process's log
    records, so every write is masked in one place. Its values grow as secrets become known:
    the model's key when the services are built (`add`, for the life of the process), a
    run's declared secrets while an attempt of that run works here (`hold`, dropped with the
    last `release`). Safe to use from many threads."""

    MIN_LEN = 8

    def __init__(self, secrets: dict[str, str] | None = None):
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}  # value -> name, for the life of the redactor
        # scope -> (holders, {value: name}): a run's declared secrets, held by its attempts.
        self._scopes: dict[str, tuple[int, dict[str, str]]] = {}
        self._pairs: tuple[tuple[str, str], ...] = ()
        for name, value in (secrets or {}).items():
            self.add(name, value)

    def add(self, name: str, value: str | None, *, scope: str | None = None) -> None:
        """Mask `value` as `[name]` from now on: for the life of the redactor, or with `scope`
        (held: see `hold`) until the scope's last release. Values shorter than MIN_LEN are
        left alone: masking them would mangle ordinary text."""
        if not value or len(value) < self.MIN_LEN:
            return
        with self._lock:
            if scope is None:
                self._values[value] = name
            else:
                if scope not in self._scopes:
                    raise ValueError(f"redactor scope {scope!r} is not held")
                self._scopes[scope][1][value] = name
            self._rebuild()

    def hold(self, scope: str) -> None:
        """One more holder of `scope` (an attempt of the run it names, working in this
        process). Values added under it stay masked until the last holder releases it. Each
        `hold` is matched by one `release`."""
        with self._lock:
            holders, values = self._scopes.get(scope, (0, {}))
            self._scopes[scope] = (holders + 1, values)

    def release(self, scope: str) -> None:
        """One holder of `scope` is done. With the last one, the scope's values are dropped:
        nothing of them stays in the redactor (a value also `add`ed stays masked)."""
        with self._lock:
            holders, values = self._scopes.get(scope, (0, {}))
            if holders <= 1:
                self._scopes.pop(scope, None)
            else:
                self._scopes[scope] = (holders - 1, values)
            self._rebuild()

    def held(self) -> list[str]:
        """The scopes held now (a run's secrets are in memory while its scope is held)."""
        with self._lock:
            return sorted(self._scopes)

    def _rebuild(self) -> None:
        names = dict(self._values)
        for _, values in self._scopes.values():
            for value, name in values.items():
                names.setdefault(value, name)
        # Longest first, so a value that contains another is masked whole.
        self._pairs = tuple(sorted(((n, v) for v, n in names.items()), key=lambda p: len(p[1]), reverse=True))

    def names(self) -> list[str]:
        """The names masked (never the values)."""
        return sorted({name for name, _ in self._pairs})

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def __call__(self, text: str) -> str:
        for name, value in self._pairs:
            if value in text:
                text = text.replace(value, f"[{name}]")
        return text

    def value(self, obj: Any) -> Any:
        """`obj` with every string in it masked: strings, dict keys and values, lists and
        tuples, and the fields of pydantic records (their identity fields aside), all the way
        down. What holds nothing to mask is returned as it is (the same object)."""
        if not self._pairs:
            return obj
        return self._value(obj)

    def _value(self, obj: Any) -> Any:
        if isinstance(obj, Enum) or obj is None or isinstance(obj, (bool, int, float)):
            return obj
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            out = {self._value(k): self._value(v) for k, v in obj.items()}
            return obj if _same_dict(obj, out) else out
        if isinstance(obj, (list, tuple)):
            items = [self._value(v) for v in obj]
            if all(a is b for a, b in zip(obj, items, strict=True)):
                return obj
            return tuple(items) if isinstance(obj, tuple) else items
        if isinstance(obj, BaseModel):
            changed = {}
            for field in type(obj).model_fields:
                if field in IDENTITY_FIELDS:
                    continue
                before = getattr(obj, field)
                after = self._value(before)
                if after is not before:
                    changed[field] = after
            return obj.model_copy(update=changed) if changed else obj
        return obj



def _same_dict(before: dict[Any, Any], after: dict[Any, Any]) -> bool:
    if len(before) != len(after):
        return False
    return all(a is b and va is vb for (a, va), (b, vb) in zip(before.items(), after.items(), strict=True))



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
    except Exception:  # noqa: BLE001 - a bad format string: leave it for logging to report
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

_ABS_PATH = re.compile(r"(?<![\w.:/~-])(?:/[\w.@+-]+){2,}/?")



def scrub_paths(text: str, *roots: str) -> str:
    """A reason as it may be recorded: no local filesystem paths (a record may leave the machine)."""
    for root in sorted((r for r in roots if r), key=len, reverse=True):
        text = text.replace(root.rstrip("/") + "/", "").replace(root, "<workspace>")
    return _ABS_PATH.sub("<path>", text)
