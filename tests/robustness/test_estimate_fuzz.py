"""`POST /estimates` and the imitation's JSON replies, given arbitrary input: the route
answers 200 or a 4xx naming what is wrong (never a 5xx) and writes nothing; a reply made for
any schema of the common keywords matches it."""

from __future__ import annotations

import json
import tempfile
from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.adapters.store import open_store
from laneflow.entrypoints.api import resolve
from laneflow.settings import Settings
from laneflow.wiring import for_store
from laneflow_dev.imitation.asked_json import instance, json_reply, schema_in
from robustness.test_api_fuzz import FIXTURES, JSONISH, TENANT, event

_folder = tempfile.mkdtemp(prefix="estimate-fuzz-")
SVC = for_store(open_store(f"sqlite:///{_folder}/laneflow.db"), Settings(capture_dir=f"{_folder}/captures"))
SVC.workspaces = FolderWorkspaces(FIXTURES)

BODIES = st.fixed_dictionaries(
    {},
    optional={
        "workspace": st.sampled_from(["ws_gate", "ws_ok", "ws_control", "../etc", "", "nowhere"]) | JSONISH,
        "flow": st.sampled_from(["fanout", "two_lanes", "brief", "fanuot", "../x", ""]) | JSONISH,
        "input": JSONISH,
        "model": st.sampled_from(["stub", "claude-sonnet-4-6", "", "nope"]) | JSONISH,
        "output_tokens": st.integers(-3, 2_000_000) | JSONISH,
        "extra": JSONISH,
    },
)


@settings(max_examples=60)
@given(body=BODIES | JSONISH)
def test_any_estimate_request_is_answered_200_or_a_4xx_and_writes_nothing(body: Any) -> None:
    out = resolve(event("POST", "/estimates", {"Content-Type": "application/json"}, json.dumps(body)), None, SVC)
    assert out["statusCode"] in (200, 400, 404), out
    answer = json.loads(out["body"])
    if out["statusCode"] == 200:
        assert answer["lanes"] and answer["cost_usd"]["low"] <= answer["cost_usd"]["high"]
    else:
        assert answer.get("message") and "Traceback" not in out["body"]
    assert SVC.store.list_runs(TENANT) == []


LEAF = st.sampled_from(
    [
        {"type": "string"},
        {"type": "string", "minLength": 7},
        {"type": "string", "pattern": "^[a-z0-9-]+$"},
        {"type": "string", "maxLength": 3},
        {"type": "integer", "minimum": 100},
        {"type": "integer", "maximum": 0},
        {"type": "number", "exclusiveMinimum": 2.5},
        {"type": "boolean"},
        {"enum": ["a", "b"]},
        {"const": 42},
        {"type": "null"},
    ]
)
SCHEMAS = st.recursive(
    LEAF,
    lambda inner: (
        st.builds(lambda items, n: {"type": "array", "items": items, "minItems": n}, inner, st.integers(0, 3))
        | st.builds(
            lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False},
            st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), inner, max_size=4),
        )
    ),
    max_leaves=8,
)


@given(schema=SCHEMAS, topic=st.text(max_size=40))
def test_a_json_reply_matches_any_schema_of_the_common_keywords(schema: dict[str, Any], topic: str) -> None:
    jsonschema.validate(instance(schema, topic=topic), schema)
    message = "Do it.\n\nEnd your reply with the result as JSON in a ```json fenced block. It must match this JSON Schema:\n"
    message += json.dumps(schema, indent=2)
    assert schema_in(message) == schema
    reply = json_reply(message, topic)
    block = reply.split("```json\n", 1)[1].rsplit("\n```", 1)[0]
    jsonschema.validate(json.loads(block), schema)
