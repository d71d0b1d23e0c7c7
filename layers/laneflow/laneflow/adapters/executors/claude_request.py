"""What a Claude step's requests carry: the stable prompt layers as one cached system block
(`cache_control` at its end, with `ttl: "1h"` when the job's `cache_ttl` is "1h") with the
dynamic layers after it, uncached; whether that stable prefix (with the tools, sent in a
stable order) is long enough to be cached at all; the agent's `effort` and the beta headers
(the effort's, the server tools'); and the colleagues' messages that join a turn as text
blocks."""

from __future__ import annotations

import json
from typing import Any

from laneflow.adapters.executors.registry import StepTools
from laneflow.domain.gate import prefix_tokens
from laneflow.domain.pricing import PriceCatalog
from laneflow.domain.records import EventType
from laneflow.ports import ExecutionSink, StepJob

DEFAULT_MAX_TOKENS = 4096


def cache_control(ttl: str) -> dict[str, str]:
    """The stable block's breakpoint: a 1-hour entry asks for `ttl: "1h"`; a 5-minute one
    sends no ttl (the API's default)."""
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def system_blocks(job: StepJob) -> list[dict[str, Any]]:
    """The system prompt: the stable layers, cached with the job's TTL, then the dynamic ones."""
    system: list[dict[str, Any]] = [{"type": "text", "text": job.system_stable, "cache_control": cache_control(job.cache_ttl)}]
    if job.system_dynamic:
        system.append({"type": "text", "text": job.system_dynamic})
    return system


def check_cacheable(prices: PriceCatalog, job: StepJob, tool_defs: list[dict[str, Any]], sink: ExecutionSink) -> None:
    """Before the first model call: a prefix (the stable layers and the tools) below the
    model's minimum cacheable length is never cached, so a lead need not hold its siblings."""
    minimum = prices.min_cacheable(job.model)
    if minimum is None:
        return
    tools = len(json.dumps(tool_defs, separators=(",", ":"), ensure_ascii=False)) if tool_defs else 0
    tokens = prefix_tokens(len(job.system_stable), tools)
    if tokens < minimum:
        sink.prefix_uncacheable(tokens, minimum)


def text_blocks(texts: list[str]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text} for text in texts]


def late_notes(tools: StepTools, *, may_go_on: bool) -> list[dict[str, Any]]:
    """After a final reply: what colleagues sent meanwhile, as one more turn's content (none
    when no turn is left)."""
    return text_blocks(tools.colleagues.pending()) if may_go_on else []


def with_notes(user: str, notes: list[str]) -> str | list[dict[str, Any]]:
    """The first user message, with what colleagues and people sent before it began."""
    if not notes:
        return user
    return [{"type": "text", "text": user}, *text_blocks(notes)]


def effort_params(job: StepJob, price: Any, sink: ExecutionSink) -> dict[str, Any]:
    """What a request carries for the agent's `effort`: `output_config` (and `betas` where
    the model takes it in beta) when the catalog says the model takes that level; else
    nothing, and the trace says so once."""
    if not job.effort:
        return {}
    levels = price.efforts if price else ()
    if job.effort not in levels:
        if levels:
            why = f"model {job.model} takes effort {', '.join(levels)}, not {job.effort!r}"
        else:
            why = f"model {job.model} does not take an effort setting"
        sink.event(EventType.warning, f"effort {job.effort!r} is not sent: {why}")
        return {}
    params: dict[str, Any] = {"output_config": {"effort": job.effort}}
    if price.effort_beta:
        params["betas"] = [price.effort_beta]
    return params


def with_betas(params: dict[str, Any], betas: list[str]) -> dict[str, Any]:
    """A request's parameters with these beta headers too (a granted server tool's), each once."""
    if not betas:
        return params
    return {**params, "betas": [*params.get("betas", []), *(b for b in betas if b not in params.get("betas", []))]}
