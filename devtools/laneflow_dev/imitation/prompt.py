"""Prompt accounting: a request's body checked as the real API checks it, its blocks
counted in tokens, and its ``cache_control`` breakpoints found (see the package docstring
for the approximations)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from laneflow.domain.pricing import catalog

MAX_BREAKPOINTS = 4


# Minimum cacheable prompt length (tokens of the prefix up to the breakpoint), per Anthropic's
# prompt-caching documentation: laneflow's price catalog keeps them (one source for the engine,
# which skips the warm gate for a prefix below it, and for this imitation). Matched by the
# longest prefix of the model id, so dated ids (claude-sonnet-4-5-20250929) work; "*" is the
# fallback.
DEFAULT_MIN_CACHEABLE: dict[str, int] = {**catalog().min_cacheable_by_model(), "*": 1024}


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _block_text(block: dict[str, Any], *, is_tool: bool = False) -> str:
    """The text whose length stands for a block's tokens."""
    if is_tool:
        return canonical(_strip_cache_control(block))
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        return str(block.get("name", "")) + canonical(block.get("input", {}))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                b.get("text", "") if isinstance(b, dict) and b.get("type") == "text" else canonical(_strip_cache_control(b))
                for b in content
            )
        return ""
    if kind == "thinking":
        return str(block.get("thinking", ""))
    return canonical(_strip_cache_control(block))


@dataclass
class Breakpoint:
    key: str
    tokens: int  # prompt tokens up to and including the breakpoint's block
    ttl: str  # "5m" | "1h"


@dataclass
class Prompt:
    tokens: int
    breakpoints: list[Breakpoint]


def _cache_control_ttl(block: dict[str, Any], where: str) -> str | None:
    cc = block.get("cache_control")
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise RequestError(400, f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise RequestError(400, f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def _prompt_items(body: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any], bool]]:
    """The request's blocks in cache order: (where, position, block, is_tool)."""
    items: list[tuple[str, Any, dict[str, Any], bool]] = []
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(400, "tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(400, f"tools.{i}: Input should be a valid dictionary")
        items.append((f"tools.{i}", ["tool"], tool, True))
    system = body.get("system")
    if isinstance(system, str):
        if system:
            items.append(("system", ["system"], {"type": "text", "text": system}, False))
    elif isinstance(system, list):
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise RequestError(400, f"system.{i}: Input should be a text block")
            items.append((f"system.{i}", ["system"], block, False))
    elif system is not None:
        raise RequestError(400, "system: Input should be a valid string or list of text blocks")
    for mi, message in enumerate(body["messages"]):
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for bi, block in enumerate(blocks):
            items.append((f"messages.{mi}.content.{bi}", ["message", mi, message["role"]], block, False))
    return items


def analyze_prompt(body: dict[str, Any], chars_per_token: int) -> Prompt:
    """Count the prompt's tokens and find its cache breakpoints (validating them)."""
    model = body["model"]
    items = _prompt_items(body)

    hasher = hashlib.sha256(model.encode("utf-8"))
    total = 0
    breakpoints: list[Breakpoint] = []
    saw_5m = False
    for where, position, block, is_tool in items:
        ttl = _cache_control_ttl(block, where)
        total += math.ceil(len(_block_text(block, is_tool=is_tool)) / chars_per_token)
        hasher.update(b"\x1e" + canonical([position, _strip_cache_control(block)]).encode("utf-8"))
        if ttl is None:
            continue
        if ttl == "1h" and saw_5m:
            raise RequestError(400, "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block")
        saw_5m = saw_5m or ttl == "5m"
        breakpoints.append(Breakpoint(key=hasher.copy().hexdigest(), tokens=total, ttl=ttl))
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise RequestError(
            400, f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(breakpoints)}."
        )
    return Prompt(tokens=total, breakpoints=breakpoints)


def validate_body(body: Any) -> None:
    """Validate the request body like the real API (a 400 naming the field)."""
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object")
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            raise RequestError(400, f"{name}: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise RequestError(400, "model: Input should be a valid string")
    mt = body["max_tokens"]
    if isinstance(mt, bool) or not isinstance(mt, int):
        raise RequestError(400, "max_tokens: Input should be a valid integer")
    if mt < 1:
        raise RequestError(400, "max_tokens: Input should be greater than or equal to 1")
    _validate_messages(body["messages"])
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError(400, "stream: Input should be a valid boolean")


def _validate_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise RequestError(400, "messages: Input should be a valid list")
    if not messages:
        raise RequestError(400, "messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(400, f"messages.{i}: Input should be a valid dictionary")
        if message.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise RequestError(400, f"messages.{i}.content: Field required")
        content = message["content"]
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise RequestError(400, f"messages.{i}.content.{j}: Input should be a content block with a type")
        elif not isinstance(content, str):
            raise RequestError(400, f"messages.{i}.content: Input should be a valid string or list")


# The effort levels each model takes (`output_config.effort`), as the API documents them, and
# the beta header a model needs them under where they are in beta. Kept here on its own (not
# read from laneflow's price catalog), so a test against the imitation checks the catalog.
EFFORT_LEVELS: dict[str, tuple[str, ...]] = {
    "claude-opus-4-6": ("low", "medium", "high", "max"),
    "claude-opus-4-5": ("low", "medium", "high"),
    "claude-sonnet-4-6": ("low", "medium", "high"),
}

EFFORT_BETAS: dict[str, str] = {"claude-opus-4-5": "effort-2025-11-24"}


def _family(model: str, table: dict[str, Any]) -> str | None:
    return max((name for name in table if model == name or model.startswith(name + "-")), key=len, default=None)


def validate_output_config(body: dict[str, Any], betas: set[str]) -> None:
    """`output_config.effort` the way the API takes it: an object, a level this model takes,
    and, for a model that takes it only in beta, the `anthropic-beta` header naming it."""
    if "output_config" not in body:
        return
    config = body["output_config"]
    if not isinstance(config, dict):
        raise RequestError(400, "output_config: Input should be a valid dictionary")
    unknown = sorted(set(config) - {"effort"})
    if unknown:
        raise RequestError(400, f"output_config.{unknown[0]}: Extra inputs are not permitted")
    if "effort" not in config:
        return
    effort, model = config["effort"], body["model"]
    family = _family(model, EFFORT_LEVELS)
    if family is None:
        raise RequestError(400, f"output_config.effort: effort is not supported by model {model}")
    if effort not in EFFORT_LEVELS[family]:
        raise RequestError(
            400,
            f"output_config.effort: {effort!r} is not supported by model {model}; supported values: {list(EFFORT_LEVELS[family])}",
        )
    beta = EFFORT_BETAS.get(family)
    if beta and beta not in betas:
        raise RequestError(
            400, f"output_config.effort: model {model} takes effort only with the beta header anthropic-beta: {beta}"
        )
