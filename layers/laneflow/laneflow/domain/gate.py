"""The warm gate's rules: which sibling holds the lead's pool slot, which sibling the gate
lets pass and which kept waiters the lead's opening hands back, what the gate tells a
sibling that passes, and the trace lines that say why.

A gated lane runs its lead in one Map and its siblings in another whose cap is the lane's
whole `parallel:`. So that the lead and its siblings together never pass that cap, one
sibling, the *reserve* (the siblings' Map iteration `parallel - 1`, which exists only when
there are at least `parallel` siblings), waits until the lead has ended, not only until its
reply began: while the lead runs, the lane runs the lead and `parallel - 1` siblings; once
it ends, `parallel` siblings. Later iterations start only as a sibling ends, so they pass at
once. With fewer siblings than `parallel` nobody is held (the whole lane fits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class GatePass:
    """The gate lets a sibling start now; `note` is what the lead left for its siblings
    (why they start without waiting for its reply), if anything."""

    note: str | None = None


GateClaim = Literal["lead", "open", "wait"]  # what `gate_claim` answers (see the store port)


@dataclass(frozen=True)
class GateWaiter:
    """A sibling's callback token the gate kept, handed back to the lead that releases it:
    the sibling's step index (None if it did not say) and whether it waited for the lead to
    end (the reserve) rather than for its reply."""

    token: str
    index: int | None = None
    until_lead_ends: bool = False


# A sibling the embedded engine readied while its lead is in flight: claimed and built, its
# request held until the lead's reply begins (adapters/engine/early.py).
READIED_LINE = "prompt cache: readied while its lead runs; its request is held until the lead's reply begins"


def is_reserve(map_index: int | None, parallel: int | None) -> bool:
    """Whether the siblings' Map iteration `map_index` of a lane capped at `parallel` holds
    the lead's pool slot: it waits until the lead has ended (see the module docstring).
    Unknown (an older definition that does not pass them): no."""
    return map_index is not None and parallel is not None and parallel > 1 and map_index == parallel - 1


def reserve_line(agent: str, parallel: int) -> str:
    return (
        f"prompt cache: waiting for the first {agent} step to end before starting: it holds one of"
        f" this lane's {parallel} slots (parallel: {parallel})"
    )


def below_minimum_line(agent: str, tokens: int, model: str, minimum: int) -> str:
    return (
        f"prompt cache: the {agent} prefix (~{tokens:,} tokens) is below {model}'s minimum cacheable length"
        f" ({minimum:,} tokens), so its siblings start at once"
    )


# A generous estimate of a prefix's tokens from its characters: real text runs about 3.5 to 4
# characters a token, JSON (the tool definitions) fewer. Counting generously errs on the cheap
# side: a prefix taken for cacheable when it is not only keeps its siblings waiting for the
# lead's first token; one taken for uncacheable when it is would make every sibling write it.
CHARS_PER_TOKEN = 3

# What Anthropic's API adds to a request that carries tools (its tool-use system prompt,
# a few hundred tokens on current models), counted with the prefix it precedes.
TOOL_USE_OVERHEAD_TOKENS = 300


def prefix_tokens(stable_chars: int, tool_chars: int) -> int:
    """A generous estimate of the tokens of a cached prefix: the stable system layers (up to
    the cache breakpoint) and the tool definitions."""
    tools = tool_chars // CHARS_PER_TOKEN + TOOL_USE_OVERHEAD_TOKENS if tool_chars else 0
    return -(-stable_chars // CHARS_PER_TOKEN) + tools


# -- the rendezvous's rules (each store keeps the gate's state and its waiters its own way,
# and makes the reads and conditional writes; these decide) ---------------------------------


def lets_pass(waiter: GateWaiter, *, opened: bool, lead_ended: bool) -> bool:
    """Whether a gate that has `opened` (the lead's reply began) and whose lead has, or has
    not, ended lets this sibling start: the reserve only once the lead has ended, every
    other sibling once the gate has opened."""
    return lead_ended if waiter.until_lead_ends else opened


def releases(waiter: GateWaiter, *, lead_ended: bool) -> bool:
    """Whether the lead's opening of the gate (with `lead_ended`, or only its reply begun)
    hands back a kept waiter: whoever the gate then lets pass."""
    return lets_pass(waiter, opened=True, lead_ended=lead_ended)


def hand_back(kept: list[GateWaiter], *, lead_ended: bool) -> tuple[list[GateWaiter], list[GateWaiter]]:
    """The kept waiters an opening hands back, in the order kept, and those it leaves
    waiting (the reserve, while the lead runs)."""
    handed = [waiter for waiter in kept if releases(waiter, lead_ended=lead_ended)]
    return handed, [waiter for waiter in kept if not releases(waiter, lead_ended=lead_ended)]
