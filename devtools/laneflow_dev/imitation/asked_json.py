"""What a step that asks for JSON gets from the imitation's default replies: a JSON value in a
```json fenced block, made to match the JSON Schema the step's message carries (laneflow's
output hint: "End your reply with the result as JSON in a ```json fenced block. It must match
this JSON Schema: {...}"), so a flow with `output: json` and a `schema:` completes on the
imitation as it would on a model that follows its instructions."""

from __future__ import annotations

import json
import re
from typing import Any

ASKS_FOR_JSON = "```json fenced block"

_SCHEMA_INTRO = "It must match this JSON Schema:"

_WORD = re.compile(r"[a-z0-9]+")


def schema_in(text: str) -> dict[str, Any] | None:
    """The JSON Schema the message asks its reply to match, if it gives one."""
    at = text.find(_SCHEMA_INTRO)
    if at < 0:
        return None
    start = text.find("{", at)
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _string(name: str, schema: dict[str, Any], topic: str) -> str:
    words = _WORD.findall(f"{topic} {name}".lower()) or ["reply"]
    text = "-".join(words) if schema.get("pattern") else " ".join(words).capitalize()
    pattern = schema.get("pattern")
    if pattern and not re.search(pattern, text):
        text = "reply"
    least = int(schema.get("minLength", 0))
    if len(text) < least:
        text = (text + ("-" if pattern else " ") + "x" * least)[: max(least, len(text))]
    most = schema.get("maxLength")
    return text[: int(most)] if most is not None else text


def instance(schema: Any, name: str = "value", topic: str = "reply", depth: int = 0) -> Any:
    """A value that matches `schema` (the common keywords: type, enum, const, properties,
    required, items, minItems, minimum, maximum, minLength, maxLength, pattern)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {key: instance(sub, key, topic, depth + 1) for key, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [instance(schema.get("items") or {"type": "string"}, name, topic, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = float(schema.get("minimum", schema.get("exclusiveMinimum", 0)) or 0)
        value = max(low + (1 if "exclusiveMinimum" in schema else 0), 1.0 if low <= 1 else low)
        if "maximum" in schema:
            value = min(value, float(schema["maximum"]))
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(name, schema, topic)


def json_reply(text: str, topic: str) -> str:
    """The reply to a message that asks for JSON: a one-sentence outcome, then the block."""
    schema = schema_in(text)
    value = instance(schema, topic=topic) if schema else {"reply": topic}
    return f"Here is the result.\n```json\n{json.dumps(value, indent=2)}\n```"
