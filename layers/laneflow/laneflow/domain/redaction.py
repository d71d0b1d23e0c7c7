"""Keeping secrets and local paths out of what is recorded.

`Redactor` masks secret values (the model's key, declared secrets) as `[NAME]`, longest
first, and each in its common encodings (`encodings`). The store applies its redactor to
everything it writes, the captures share it, and the wiring has the process's log records
masked by it (laneflow.adapters.logs): three doors, one set of values.
`scrub_paths` removes local filesystem paths from reasons. A capture holds a tool call's
input and output, masked; at most `STEP_CAPTURE_LIMIT` characters per step, after which
no later call of the step is captured (its calls keep names, sizes and times only).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote, quote_plus

from pydantic import BaseModel

STEP_CAPTURE_LIMIT = 4_000_000


# Fields of a record that name it (keys, identities, times): never rewritten, so a masked
# record is still found where it was written.
IDENTITY_FIELDS = frozenset({"id", "tenant", "run_id", "token", "op_id", "started_at", "resumed_at", "t", "at"})


_URL_SAFE = str.maketrans("+/", "-_")

_PERCENT = re.compile(r"%[0-9A-F]{2}")

_JSON_U = re.compile(r"\\u[0-9a-f]{4}")

# The mark a value is replaced by when its own `[NAME]` would hold a value again (a value that
# is part of its name): short enough never to hold one (values have 8 characters or more).
SAFE_MARK = "[*]"

# Passes of the replacement before it settles for SAFE_MARK (see `Redactor.__call__`).
_PASSES = 4


def encodings(value: str) -> list[str]:
    """The forms `value` takes in text that encodes it, the value itself first: base64
    (standard and URL-safe, with and without padding), hex (lower and upper case), percent-
    encoding (`%2F` and `%2f`, `+` or `%20` for a space, `/` kept or not) and JSON escapes
    (what a value is inside a JSON string: `\\"`, `\\\\`, `\\n`, `\\u00e9` or the character
    itself, `\\/` or `/`; and escaped twice, as in a JSON document kept inside a JSON string).
    Encodings are of the value's UTF-8 bytes.

    A base64 copy inside a longer base64 stream is at one of 3 alignments (the stream's bytes
    before it, modulo 3). At each, the characters that encode only the value's own bits are
    the same whatever surrounds it: those are listed (at most 3 characters at each end depend
    on the neighbours' bits, and stay; they hold at most 4 of the value's bits each). The
    whole forms come first, so a copy standing alone is masked whole with its padding."""
    raw = value.encode("utf-8")
    forms = [value]
    whole = base64.b64encode(raw).decode("ascii")
    for b64 in (whole, whole.translate(_URL_SAFE)):
        forms += [b64, b64.rstrip("=")]
    for before in (0, 1, 2):
        stream = base64.b64encode(b"\0" * before + raw).decode("ascii")
        # Character i holds bits [6i, 6i + 6) of the stream; the value's are [8 * before, 8 * (before + len)).
        own = stream[-(-8 * before // 6) : 8 * (before + len(raw)) // 6]
        forms += [own, own.translate(_URL_SAFE)]
    forms += [raw.hex(), raw.hex().upper()]
    for percent in (quote(value, safe=""), quote(value, safe="/"), quote_plus(value, safe=""), quote_plus(value, safe="/")):
        forms += [percent, _PERCENT.sub(lambda m: m.group().lower(), percent)]
    for escaped in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        for form in (escaped, _JSON_U.sub(lambda m: "\\u" + m.group()[2:].upper(), escaped)):
            forms += [form, form.replace("/", "\\/")]
        forms.append(json.dumps(escaped, ensure_ascii=False)[1:-1])  # a JSON document inside a JSON string
    return list(dict.fromkeys(forms))


@dataclass
class _Scope:
    """A run's values while its work is here: how many hold them, and whether they are loaded."""

    holders: int = 0
    values: dict[str, str] = field(default_factory=dict)  # value -> name
    loaded: bool = False
    loading: threading.Event | None = None  # set while a holder loads them; others wait on it


class Redactor:
    """Replaces every secret value of 8 characters or more by its name (`[NAME]`), in every
    form listed by `encodings`, the longest form of any value first.

    One redactor belongs to a store and is shared by its captures and the process's log
    records, so every write is masked in one place. Its values grow as secrets become known:
    the model's key when the services are built (`add`, for the life of the process), a
    run's secrets while work of that run is done here (`hold`, loaded by its first holder,
    dropped with the last `release`). Safe to use from many threads."""

    MIN_LEN = 8

    def __init__(self, secrets: dict[str, str] | None = None):
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}  # value -> name, for the life of the redactor
        self._scopes: dict[str, _Scope] = {}  # a run's secrets, held while its work is here
        self._pairs: tuple[tuple[str, str], ...] = ()  # (name, form), longest form first
        self._marks: dict[str, str] = {}  # name -> what its forms are replaced by
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
                self._scopes[scope].values[value] = name
            self._rebuild()

    def hold(self, scope: str, load: Callable[[], Mapping[str, str]] | None = None) -> None:
        """One more holder of `scope` (work of the run it names, in this process). Values
        added under it stay masked until the last holder releases it. Each `hold` is matched
        by one `release`, also when `load` raises.

        `load` gives the scope's values (name -> value). The first holder given one calls it
        (nobody else does while the scope is held), and every holder returns only once they
        are masked: a second thread holding the scope while the first loads waits for it, so
        nothing it records goes out before the values are in."""
        with self._lock:
            held = self._scopes.setdefault(scope, _Scope())
            held.holders += 1
            waiting = held.loading
            mine = load is not None and not held.loaded and waiting is None
            if mine:
                held.loading = threading.Event()
        if waiting is not None:
            waiting.wait()
        if not mine:
            return
        assert load is not None and held.loading is not None
        values: Mapping[str, str] | None = None
        try:
            values = load()
        finally:
            with self._lock:
                for name, value in (values or {}).items():
                    if value and len(value) >= self.MIN_LEN:
                        held.values[value] = name
                # A load that raised is tried again by the next holder given one.
                held.loaded, done, held.loading = values is not None, held.loading, None
                self._rebuild()
            done.set()

    def release(self, scope: str) -> None:
        """One holder of `scope` is done. With the last one, the scope's values are dropped:
        nothing of them stays in the redactor (a value also `add`ed stays masked)."""
        with self._lock:
            held = self._scopes.get(scope)
            if held is not None and held.holders > 1:
                held.holders -= 1
            elif self._scopes.pop(scope, None) is not None:
                self._rebuild()

    def held(self) -> list[str]:
        """The scopes held now (a run's secrets are in memory while its scope is held)."""
        with self._lock:
            return sorted(self._scopes)

    def _rebuild(self) -> None:
        names = dict(self._values)
        for held in self._scopes.values():
            for value, name in held.values.items():
                names.setdefault(value, name)
        forms: dict[str, str] = {}
        for value, name in names.items():
            for form in encodings(value):
                if len(form) >= self.MIN_LEN:
                    forms.setdefault(form, name)
        # Longest first, so a value that contains another is masked whole.
        self._pairs = tuple(sorted(((n, f) for f, n in forms.items()), key=lambda p: len(p[1]), reverse=True))
        # A name whose `[NAME]` holds a form (a value that is part of its own name) is marked
        # SAFE_MARK instead: its mark would put the value back.
        marks = {name: f"[{name}]" for name in set(forms.values())}
        self._marks = {n: SAFE_MARK if any(f in mark for _, f in self._pairs) else mark for n, mark in marks.items()}

    def names(self) -> list[str]:
        """The names masked (never the values)."""
        return sorted({name for name, _ in self._pairs})

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def __call__(self, text: str) -> str:
        """`text` with every form of every value replaced by its mark. A replacement can make
        a form again out of the text around it (`a[K]b...` where a value reads `[K]b...`), so
        the passes go on until none is left: a few with the names, then with SAFE_MARK, which
        always shortens the text and so comes to an end."""
        pairs, marks = self._pairs, self._marks
        for round_ in range(_PASSES + len(text)):
            changed = False
            for name, form in pairs:
                if form in text:
                    text = text.replace(form, marks[name] if round_ < _PASSES else SAFE_MARK)
                    changed = True
            if not changed:
                break
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
            for field_ in type(obj).model_fields:
                if field_ in IDENTITY_FIELDS:
                    continue
                before = getattr(obj, field_)
                after = self._value(before)
                if after is not before:
                    changed[field_] = after
            return obj.model_copy(update=changed) if changed else obj
        return obj


def _same_dict(before: dict[Any, Any], after: dict[Any, Any]) -> bool:
    if len(before) != len(after):
        return False
    return all(a is b and va is vb for (a, va), (b, vb) in zip(before.items(), after.items(), strict=True))


_ABS_PATH = re.compile(r"(?<![\w.:/~-])(?:/[\w.@+-]+){2,}/?")


def scrub_paths(text: str, *roots: str) -> str:
    """A reason as it may be recorded: no local filesystem paths (a record may leave the machine)."""
    for root in sorted((r for r in roots if r), key=len, reverse=True):
        text = text.replace(root.rstrip("/") + "/", "").replace(root, "<workspace>")
    return _ABS_PATH.sub("<path>", text)
