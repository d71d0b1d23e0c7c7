"""The harbour's tide tables, an MCP server on stdio in Python's standard library alone (so
it runs on the system's Python, inside a sandbox as outside one): the initialize handshake,
`tools/list`, and `tools/call` of `high_water`, which answers a port's next high water from
a small fixed table."""

from __future__ import annotations

import json
import sys
from typing import Any

TABLE = {"brest": ("06:12", 6.9), "saint-malo": ("06:41", 12.1), "dover": ("10:55", 6.3)}

TOOL = {
    "name": "high_water",
    "description": "The next high water of a port: its time (local) and height in metres.",
    "inputSchema": {"type": "object", "properties": {"port": {"type": "string"}}, "required": ["port"]},
}


def high_water(port: str) -> tuple[str, bool]:
    found = TABLE.get(port.strip().lower())
    if found is None:
        return f"no tide table for {port!r}; the tables know {', '.join(sorted(TABLE))}", True
    time, height = found
    return f"{port}: next high water at {time}, {height} m", False


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:  # a notification
        return None
    params = request.get("params") or {}
    if method == "initialize":
        version = params.get("protocolVersion", "2025-06-18")
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tide-tables", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and params.get("name") == "high_water":
        text, failed = high_water(str((params.get("arguments") or {}).get("port", "")))
        result = {"content": [{"type": "text", "text": text}], "isError": failed}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


for line in sys.stdin:
    if line.strip():
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
