"""The store's rule book: every rule of `ports.Store`, once, over a few primitives.

`RuleBookStore` implements every public method of `Store`. It owns what the stores agree on:
the tenant check at every entry point, the masking of every write, the refusals and their
messages, attempt numbering, the claim journal's replay, what a fence means, costs rounded,
and what a damaged record does (a read raises `RecordDamaged`, a list passes over it). A
backend (SQLite, DynamoDB) implements the primitives: each is one read, or one
conditional write that either lands whole or raises `Refused` having written nothing, and
none decides anything the rules decide. (The model is an idempotency persistence layer
whose base class holds the protocol and whose backends put and get records.)

Decisions are optimistic: the rules read what a write depends on (`_read_step_state`),
decide, and write conditionally on what they read (`seen`); a write refused because the
step changed meanwhile is decided again on what it now holds. A refusal's reason is always
read, never guessed, so every store refuses the same things with the same words.

The rules are in parts by what they govern: rulebook_runs.py (runs and steps),
rulebook_attempts.py (claims, fenced writes, the claim journal, the trace),
rulebook_inbox.py (handoffs, the warm gate, inboxes), rulebook_prefixes.py (the prefix
registry), rulebook_schedules.py (schedules and their firings); rulebook_base.py has what they share
(the messages, the public methods' wrapper, reading records into models).

The primitives, one read or one conditional write each, are listed (with what they
exchange: `StepState`, `Claim`, `AttemptWrite`, `Fenced`, `Refused`) in
laneflow.adapters.store.primitives.

A store the infrastructure cannot serve now (throttled, locked past its timeout) raises
`TransientError` from its primitives; the state machine retries it by name.
"""

from __future__ import annotations

from typing import Any

from laneflow.adapters.store.rulebook_attempts import AttemptRules
from laneflow.adapters.store.rulebook_inbox import InboxRules
from laneflow.adapters.store.rulebook_prefixes import PrefixRules
from laneflow.adapters.store.rulebook_runs import RunRules
from laneflow.adapters.store.rulebook_schedules import ScheduleRules
from laneflow.ports import Store

# Each write, and the arguments of it that carry recorded text (results, instructions,
# messages, reasons, events, spans, handoffs, inputs...): masked before it is written.
REDACTED_WRITES: dict[str, tuple[str, ...]] = {
    "create_run": ("run",),
    "update_run": ("changes",),
    "add_steps": ("steps",),
    "update_step": ("changes",),
    "claim_attempt": ("worker", "message"),
    "end_attempt": ("reason", "step", "calls"),
    "add_event": ("event",),
    "put_call": ("call",),
    "put_handoff": ("text",),
    "post_note": ("note",),
    "answer_question": ("text",),
    "create_schedule": ("schedule",),
    "record_firing": ("firing",),
}

# Writes that carry only keys, identities, times, statuses and hashes: nothing to mask.
UNMASKED_WRITES = frozenset(
    {
        "request_stop",
        "add_run_cost",
        "heartbeat",
        "journal_begin",
        "journal_settle",
        "set_prompt_layers",
        "gate_wait",
        "gate_open",
        "gate_claim",
        "prefix_claim",
        "prefix_began",
        "prefix_read",
        "prefix_release",
        "prefix_wait",
        "close_question",
        "observe",
        "set_schedule_state",
        "delete_schedule",
    }
)

_PUBLIC = frozenset(name for name, member in vars(Store).items() if getattr(member, "__isabstractmethod__", False))


# -- the rule book ---------------------------------------------------------------------------------


class RuleBookStore(RunRules, AttemptRules, InboxRules, PrefixRules, ScheduleRules):
    """Every public method of `Store`, over the primitives a backend implements (in parts:
    laneflow.adapters.store.rulebook_runs, rulebook_attempts, rulebook_inbox; what they share
    in rulebook_base)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__mro__[: cls.__mro__.index(RuleBookStore)]  # the backend's classes (parts included)
        overridden = sorted(_PUBLIC & {name for klass in own for name in vars(klass)})
        if overridden:
            raise TypeError(
                f"{cls.__name__} overrides {', '.join(overridden)}: a backend implements the primitives,"
                " the rules are RuleBookStore's"
            )
