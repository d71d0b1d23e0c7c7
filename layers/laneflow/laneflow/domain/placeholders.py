"""Filling `{item}` and `{input.NAME}` into instructions and stub answers."""

from __future__ import annotations

import json
import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{(item|input(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\}")


def render_value(value: Any) -> str:
    """A value as it reads in a prompt: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def lookup_input(run_input: Any, dotted: str) -> tuple[bool, Any]:
    """`input.a.b` looked up in the run input: (found, value)."""
    value = run_input
    for part in dotted.split(".")[1:]:
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def fill(text: str, *, item: Any = None, run_input: Any = None, has_item: bool = False) -> str:
    """Replace `{item}` (when the step has one) and `{input.NAME}` (when the input has it).
    Placeholders that name nothing are left as written, so a mistake stays visible."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "item":
            return render_value(item) if has_item else match.group(0)
        found, value = lookup_input(run_input, name)
        return render_value(value) if found else match.group(0)

    return _PLACEHOLDER.sub(replace, text)
