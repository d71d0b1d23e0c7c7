"""Strict JSON: what laneflow takes in as JSON, and what it refuses.

Python's JSON reader takes more than JSON: `NaN`, `Infinity` and `-Infinity`, numbers
that overflow to infinity (`1e999`), text holding lone surrogates (`"\ud800"`, which is
not a character and cannot be written as UTF-8), and nesting deep enough to exhaust the
interpreter's stack. Stored, such a value breaks every later read of the store (SQLite's
JSON functions refuse it) and every JSON client of the API. So every entrance reads JSON
through `loads` (text) or `check` (a value already built, such as YAML from a flow), and
refuses, naming where in the value:

- NaN and Infinity (as constants, or a number too large to be finite);
- integers of more than MAX_DIGITS digits;
- text with a lone surrogate (in a value or a key);
- nesting deeper than MAX_DEPTH levels of lists and objects;
- more than MAX_CHARS characters (of text, or of the value written as JSON);
- in JSON text, a key given twice in one object (Python's reader keeps the last one
  without a word, so `{"budget": 1, "budget": 100}` would be taken as 100);
- for values not read from JSON text: keys that are not text, values JSON has no type
  for (a YAML date), and a value that contains itself (a YAML alias loop).

`parse` is the building block (it raises `json.JSONDecodeError` for text that is not JSON
and `Refusal` for the rest), so the API can answer each in its own shape; `parse_stored` is
what the stores read their own JSON columns with.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from laneflow.domain.errors import InvalidInput, Problem

__all__ = [
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_CHARS",
    "Refusal",
    "JsonRefused",
    "parse",
    "loads",
    "refusal",
    "check",
    "parse_stored",
    "json_path",
]


MAX_DEPTH = 64  # levels of lists and objects; no run input or schema needs more

MAX_DIGITS = 100  # digits of an integer (Python refuses more than 4,300 with a ValueError)

MAX_CHARS = 1024 * 1024  # characters of JSON text: 1 MiB


_SURROGATE = re.compile("[\ud800-\udfff]")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class Refusal(ValueError):
    """A JSON value laneflow does not take: where in it (`parts`, keys and indexes from the
    root), and why (`reason`)."""

    def __init__(self, parts: tuple[str | int, ...], reason: str):
        self.parts = parts
        self.reason = reason
        super().__init__(f"{json_path(parts)}: {reason}")

    @property
    def path(self) -> str:
        return json_path(self.parts)


class JsonRefused(InvalidInput):
    """JSON from a person refused at an entrance: `source` names the entrance (`--input`,
    a file), the problem names the field (`$.a.b[0]`) and, for text that is not JSON, the
    line. Printed as one line."""

    def __init__(self, source: str, reason: str, *, field: str | None = None, line: int | None = None):
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {reason}", [Problem(file=source, line=line, field=field, message=reason)])
        self.source, self.reason, self.field = source, reason, field

    def __str__(self) -> str:  # the one problem is the message: no second copy below it
        return str(self.args[0])


def json_path(parts: tuple[str | int, ...]) -> str:
    """`$.topics[0]["a key"]`: a JSONPath-like name of a place in a value."""
    if len(parts) > 8:  # deep places are shown by their ends
        return json_path(parts[:3]) + "…" + json_path(parts[-2:])[1:]
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _NAME.match(part):
            out += f".{part}"
        else:  # ensure_ascii: a lone surrogate in a key is shown escaped, never printed raw
            shown = part if len(part) <= 40 else part[:40] + "…"
            out += f"[{json.dumps(shown)}]"
    return out


# -- reading text -------------------------------------------------------------------------------


class _Unfit:
    """What the reader's hooks put where a number JSON cannot carry stood (or an object
    with a repeated key: `key`, named in the place), so `refusal` can name its place."""

    __slots__ = ("reason", "key")

    def __init__(self, reason: str, key: str | None = None):
        self.reason, self.key = reason, key


def _constant(name: str) -> _Unfit:
    return _Unfit(f"{name} is not a number JSON allows (it has no NaN or Infinity)")


def _float(text: str) -> float | _Unfit:
    value = float(text)
    if math.isfinite(value):
        return value
    shown = text if len(text) <= 30 else text[:30] + "…"
    return _Unfit(f"{shown} is too large to be a number (it would be infinite)")


def _int(text: str) -> int | _Unfit:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        return _Unfit(f"a number of {digits} digits; at most {MAX_DIGITS} are taken")
    return int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Unfit:
    """An object, or an `_Unfit` naming its first repeated key (in text order)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    return _Unfit(f"the key {_shown_key(repeated)} is given twice in one object; give it once", key=repeated)


def _shown_key(key: str) -> str:
    shown = key if len(key) <= 40 else key[:40] + "…"
    return json.dumps(shown)  # ensure_ascii: a lone surrogate is shown escaped, never printed raw


def parse(text: str) -> Any:
    """Read JSON text strictly. Raises `json.JSONDecodeError` when it is not JSON at all,
    `Refusal` when it is JSON laneflow does not take (see the module docstring)."""
    if len(text) > MAX_CHARS:
        raise Refusal((), f"more than {MAX_CHARS:,} characters of JSON")
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int, object_pairs_hook=_object)
    except RecursionError:  # the C reader guards its recursion: this is safe to catch
        raise Refusal((), f"nested deeper than {MAX_DEPTH} levels of lists and objects") from None
    found = refusal(value, json_text=True)
    if found is not None:
        raise found
    return value


def loads(text: str, source: str) -> Any:
    """Read JSON text from a person (`source` names where it came from, for the error).
    Raises `JsonRefused` (an `InvalidInput`) naming the source and the field, or the line
    and column for text that is not JSON."""
    try:
        return parse(text)
    except json.JSONDecodeError as e:
        raise JsonRefused(source, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", line=e.lineno) from None
    except Refusal as e:
        raise JsonRefused(source, e.reason, field=e.path) from None


def parse_stored(text: str) -> Any:
    """Read JSON a store wrote. Raises ValueError (a `Refusal` for nesting too deep) for
    what no entrance lets in, so the store can treat the record as damaged."""
    try:
        return json.loads(text, parse_constant=_refuse_stored)
    except RecursionError:
        raise Refusal((), f"nested deeper than {MAX_DEPTH} levels of lists and objects") from None


def _refuse_stored(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


# -- checking values ----------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    names = {type(None): "null", bool: "true/false", int: "a number", float: "a number", str: "text"}
    return names.get(type(value), f"a {type(value).__name__}")


def _text_refusal(text: str, parts: tuple[str | int, ...], what: str) -> Refusal | None:
    bad = _SURROGATE.search(text)
    if bad is None:
        return None
    code = f"\\u{ord(bad.group()):04x}"
    return Refusal(parts, f"{what} holds a lone surrogate ({code}), which is not a character; write the character itself")


def refusal(value: Any, parts: tuple[str | int, ...] = (), *, json_text: bool = False) -> Refusal | None:
    """The first reason `value` is not JSON laneflow takes, or None.

    Walks the value once: a list or object reached twice (a YAML alias) is measured once,
    so a value that expands to billions of nodes is refused by its size, not walked. With
    `json_text` (the value was just read from text no longer than MAX_CHARS) every node is
    checked and the size is not: the text was measured, and only aliases could exceed it."""
    try:
        _Walk(math.inf if json_text else MAX_CHARS).size(value, parts, 0)
    except Refusal as found:
        return found
    return None


class _Walk:
    """One walk of a value: the size of each node written as JSON, or a `Refusal`."""

    def __init__(self, limit: float):
        self.limit = limit
        self.sizes: dict[int, int] = {}  # lists and objects measured (an alias is measured once)
        self.walking: set[int] = set()  # lists and objects being measured (an alias loop)

    def size(self, v: Any, at: tuple[str | int, ...], depth: int) -> int:
        if isinstance(v, (list, dict)):
            return self._container(v, at, depth)
        return self._scalar(v, at)

    def _scalar(self, v: Any, at: tuple[str | int, ...]) -> int:
        if v is None or isinstance(v, bool):
            return 5
        if isinstance(v, int):
            digits = len(str(abs(v))) if v.bit_length() <= MAX_DIGITS * 4 else MAX_DIGITS + 1
            if digits > MAX_DIGITS:
                raise Refusal(at, f"a number of more than {MAX_DIGITS} digits")
            return digits + 1
        if isinstance(v, float):
            if not math.isfinite(v):
                raise Refusal(at, f"{v} is not a finite number (JSON has no NaN or Infinity)")
            return 24
        if isinstance(v, _Unfit):
            raise Refusal(at if v.key is None else (*at, v.key), v.reason)
        if isinstance(v, str):
            if (bad := _text_refusal(v, at, "the text")) is not None:
                raise bad
            return len(v) + 2
        hint = "; quote it to pass it as text" if type(v).__name__ in ("date", "datetime") else ""
        raise Refusal(at, f"{_type_name(v)} is not a JSON value{hint}")

    def _container(self, v: list[Any] | dict[Any, Any], at: tuple[str | int, ...], depth: int) -> int:
        if depth >= MAX_DEPTH:
            raise Refusal(at, f"nested deeper than {MAX_DEPTH} levels of lists and objects")
        key = id(v)
        if key in self.sizes:
            return self.sizes[key]
        if key in self.walking:
            raise Refusal(at, "contains itself (an alias that refers to its own value)")
        self.walking.add(key)
        total = 2
        for k, item in v.items() if isinstance(v, dict) else enumerate(v):
            if isinstance(v, dict):
                total += len(self._key(k, at)) + 3
            total += 1 + self.size(item, (*at, k), depth + 1)
            if total > self.limit:
                break
        self.walking.discard(key)
        if total > self.limit:
            raise Refusal(at, f"more than {MAX_CHARS:,} characters when written as JSON")
        self.sizes[key] = total
        return total

    @staticmethod
    def _key(k: Any, at: tuple[str | int, ...]) -> str:
        if not isinstance(k, str):
            raise Refusal(at, f"a key must be text, got {_type_name(k)} ({str(k)[:40]!r})")
        if (bad := _text_refusal(k, at, "a key")) is not None:
            raise bad
        return k


def check(value: Any, source: str, parts: tuple[str | int, ...] = ()) -> None:
    """Refuse (`JsonRefused`, naming `source` and the field) a value that is not JSON
    laneflow takes. For values built by other means than `loads` (YAML, a Python caller)."""
    found = refusal(value, parts)
    if found is not None:
        raise JsonRefused(source, found.reason, field=found.path)
