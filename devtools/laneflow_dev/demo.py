"""The demo: the example newsroom flow, on the stub model or on the local Messages API
imitation (`laneflow demo --imitate`), so a person sees cache reads without an API key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from laneflow_dev.imitation import MessagesImitation, Reply, default_responder

WORKSPACE = "examples/newsroom"

FLOW = "brief"

INPUT = {"topics": ["tides", "coral reefs", "deep-sea vents", "kelp forests", "sea ice"]}


@dataclass(frozen=True)
class Demo:
    """One of the demos `laneflow demo NAME` runs: an example workspace, a flow and its input.
    `writes`: its steps keep files in the workspace, so it runs on a fresh copy of the example
    (beside the store), never on the project's own examples/."""

    workspace: str
    flow: str
    input: dict[str, Any]
    writes: bool = False
    imitates: bool = True  # `--imitate` can run it (the imitation answers its steps)


DEMOS = {
    "newsroom": Demo(WORKSPACE, FLOW, INPUT),
    # A sandboxed agent runs the harbour's script with its declared secret (examples/tides/.secrets.env).
    "tides": Demo("examples/tides", "tides", {"places": ["Brest", "Saint-Malo", "Dover"]}, writes=True, imitates=False),
    # An editor delegates each port to a researcher, who searches the knowledge and asks an
    # MCP server (examples/almanac/agents/researcher/servers/tide_tables.py) for the tides.
    "almanac": Demo("examples/almanac", "almanac", {"ports": ["Brest", "Saint-Malo", "Dover"]}, imitates=False),
}

IMITATION_MODEL = "claude-sonnet-4-6"

IMITATION_KEY = "sk-imitation-demo"

POST = {"title": "Five ways the ocean keeps its records", "slug": "ocean-records", "words": 300, "tags": ["ocean", "brief"]}


def demo_responder(body: dict[str, Any]) -> Reply:
    """The imitation's default replies, except that a step asked for JSON gets a post
    record that matches the demo's schema."""
    first = body.get("messages", [{}])[0].get("content", "")
    text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first if isinstance(b, dict))
    if "```json" in text:
        return Reply(text="The post is ready to publish.\n```json\n" + json.dumps(POST) + "\n```")
    return default_responder(body)


def imitation() -> MessagesImitation:
    """A Messages API imitation with a realistic time to first token."""
    return MessagesImitation(ttft_ms=300, token_ms=2, responder=demo_responder, api_keys={IMITATION_KEY})
