"""The DynamoDB store: one table, and an S3 bucket for values too large for an item.

Items (one table; `pk` is always tenant-first, `idx` is a step index zero-padded to 8
digits, `n` an attempt number padded to 6, so keys sort in index order):

| item            | pk                 | sk                         | holds                                   |
|-----------------|--------------------|----------------------------|-----------------------------------------|
| run             | T#<tenant>#R#<run> | RUN                        | every Run field but input and flow_spec |
| run input       | T#<tenant>#R#<run> | RUN#INPUT                  | input, flow_spec (JSON; never change)   |
| step            | T#<tenant>#R#<run> | S#<idx>                    | the Step's fields, and (below) its      |
|                 |                    |                            | latest attempts, journal, layers, spans |
| older attempt   | T#<tenant>#R#<run> | A#<idx>#<n>                | an ended Attempt moved off its step     |
| older journal   | T#<tenant>#R#<run> | J#<sha(op_id)>             | a settled entry moved off its step;     |
|                 |                    |                            | expires_at is the TTL                   |
| event           | T#<tenant>#R#<run> | T#<idx>#E#<time ns><rand>  | t, type, text, attempt, data            |
| model-call span | T#<tenant>#R#<run> | T#<idx>#C#<call id>        | n, body: a span its step did not keep   |
| handoff         | T#<tenant>#R#<run> | H#<key>                    | text                                    |
| gate            | T#<tenant>#R#<run> | G#<key>                    | opened_at                               |
| gate token      | T#<tenant>#R#<run> | GT#<sha(key)>#<sha(token)> | token (one item per waiting sibling)    |

What a step's attempts write lives on the step item, so each write of a step's happy path
is one conditional write of one item:
- `A<n>`: attempt n, a map (t token, s started_at, r resumed_at, st status, e ended_at,
  why reason, k reason_kind, w worker, hb heartbeat_at, op op_id). `live_n` names the running one (a claim
  needs it absent); `last_n` keeps attempt numbers from ever repeating. A step keeps its
  latest ATTEMPTS_ON_STEP; a claim that would keep more first copies the oldest to `A#`
  items (an ended attempt never changes again, so a copy is never stale).
- `J<sha(op_id)>`: the claim journal's entries of the step, a map (s status, c created_at,
  x expires_at; op while pending, n once completed); `jp` counts the pending ones. A
  claim drops settled entries past their expiry (what TTL did) and moves those past
  JOURNAL_ON_STEP to `J#` items (`jm` counts them), so the item never grows with time.
  An op_id names one step: `journal_get` and `journal_settle`, which are not told which,
  find it with a filtered Query of the run's steps.
- `layers`: the step's prompt layers (created with, replaced by a claim's or
  `set_prompt_layers`).
- `calls`: spans by id, a map of at most CALLS_ON_STEP spans of at most CALL_INLINE_MAX
  bytes each; other spans are items of their own. The map wins over an item of the same id,
  and a write that puts a span's item removes its id from the map in the same write.
Everything of a run is one partition. Everything at or after `RUN` is what `get_run`
shows, so a run reads in one Query: `RUN`..`S#~` is the run and its steps (no trace),
`RUN`..end adds the trace. Events are items of their own, never a growing list.

Indexes (both in template.yaml's RunsTable, which the contract test builds the table from):
- `by-tenant` (lpk = `T#<tenant>#RUNS`, lsk = `<created_at>#<seq>`, projects `status`): every
  run, for `list_runs` newest first.
- `live` (vpk, vsk; keys only) is sparse: `vpk` is set only on a run queued, running or
  awaiting approval (`T#<tenant>#LIVE#RUN`), and on a step with a running attempt or a
  pending journal entry (`...#LIVE#STEP`), and removed by the write that ends the last of
  them. `active_runs`, `running_attempts` and `journal_pending` Query it for one tenant;
  for all tenants (reconcile) they Scan it - it holds only what is live, so the cost
  grows with live things, never with the table. Keeping every index key tenant-first means
  a tenant-scoped IAM policy (`dynamodb:LeadingKeys`) covers the indexes too. A step's
  entry is made by `journal_begin` (or a claim without one) and kept, unchanged, by the
  claim: a step's happy path writes the index twice.

Writes. Every conditional write is a ConditionExpression. A step's happy path is
`journal_begin` (the entry pending, the step into the live index), `claim_attempt` (the
attempt running, the entry completed, its worker and the step's layers) and `end_attempt`
(the attempt ended, the step's changes, the spans, the step out of the live index): three
UpdateItems of the step item. A write about an attempt is conditional on the step item's
`A<n>` having the ref's exact identity (token, started_at, resumed_at - absent when None),
status running and `live_n = n`. Worker, heartbeat, prompt layers and spans that fit are
single updates of the step item too; an event (an item of its own) is a TransactWriteItems
of a ConditionCheck on the step item and the put. Transactions are left for what one item
cannot carry: `end_attempt` with a run cost (+ the run item) or spans the step cannot keep
(+ their items), `create_run`, `add_steps`, `gate_wait`. A refused write raises the domain
error (`Conflict`, `AttemptEnded`, `RunNotFound`, `NotFound`) and changed nothing. Where a
write's cheap form depends on what the item holds (room for spans, other pending journal
entries), it is conditional on that too, and a refusal that found the attempt still
running is retried in the form the item it found calls for. Costs are added with ADD,
exactly, as decimals rounded to 6 places.

Large values. A text or JSON attribute (input, flow_spec, instruction, message, result,
conclusion, data, item, error, reason, event text and data, span body, handoff text,
layers...) over `blob_threshold` (64 KB) goes to
`s3://<bucket>/<tenant>/<run_id>/<sk>/<attr>-<uuid>` and the item keeps `{"s3": "s3://..."}`; reads resolve it. A blob's key is new on every write,
so a refused write never changes what a stored pointer reads (its upload is deleted). If an
item would still pass ~350 KB, its largest values go to S3 too. Without a bucket, such a
write raises `ItemTooLarge` instead of failing at DynamoDB's 400 KB.

Reads are strongly consistent (index reads cannot be; what an index names is re-read
consistently and re-checked). `create_run` of more than 100 items (a transaction's limit)
writes the run hidden, then its items, then reveals it in one update; a crash in between
leaves a hidden run that reads as absent. `add_steps` (rescue records) writes at most 99
items at once, in one transaction.

Capacity. `consumed()` returns read and write units by operation, counted from item sizes
by DynamoDB's rules (1 WCU per KB written, 1 RCU per 4 KB read strongly, half that for
index reads, transactions twice, a ConditionCheck as a 1 KB transactional write, an
index entry written or removed 1 WCU; a write that leaves an index key as it was writes no
index entry). An update is counted on the size of the whole item after it (DynamoDB bills
the larger of before and after) where the store knows it - it asks for the item back, or
read it just before - else on the size of what it writes: a lower bound for updates of
large items. moto reports no real capacity, so the count is the store's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import secrets
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from enum import Enum
from functools import cache, wraps
from typing import Any, Callable, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from pydantic import ValidationError

# Store-neutral helpers the SQLite store defines (the same messages and validation on both).
from laneflow.adapters.store.sqlite import (
    COST_DECIMALS,
    _dumps,
    _field_adapter,
    _misfit,
    _refuse_status,
    _statuses,
)
from laneflow.domain import jsonsafe
from laneflow.domain.errors import (
    AttemptEnded,
    Conflict,
    InvalidInput,
    NotFound,
    RecordDamaged,
    RunNotFound,
)
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    FailureKind,
    JournalEntry,
    JournalStatus,
    ModelCall,
    PromptLayer,
    Run,
    RunStatus,
    Step,
    StepStatus,
    utcnow,
)
from laneflow.domain.tenants import check_tenant
from laneflow.ports import RUN_FIELDS, STEP_FIELDS, Store

log = logging.getLogger("laneflow.store")


BLOB_THRESHOLD = 64 * 1024

ITEM_LIMIT = 350 * 1024  # a margin under DynamoDB's 400 KB per item

TRANSACTION_ITEMS = 100

TRANSACTION_BYTES = 4 * 1024 * 1024 - 64 * 1024

BY_TENANT_INDEX = "by-tenant"

LIVE_INDEX = "live"


# What a step item keeps of its own (see the module docstring); the rest moves to items.
ATTEMPTS_ON_STEP = 3  # attempt records: the running one and the latest ended

JOURNAL_ON_STEP = 3  # settled claim journal entries

CALLS_ON_STEP = 4  # model-call spans

CALL_INLINE_MAX = 1024  # bytes of a span kept in the step item


RUN_SK = "RUN"

INPUT_SK = "RUN#INPUT"

STEPS_END = "S#~"  # after every `S#<idx>`, before `T#`


_ACTIVE_RUN = frozenset({RunStatus.queued.value, RunStatus.running.value, RunStatus.awaiting_approval.value})


# How a model field is kept. JSON fields are kept as JSON text (exact types, floats and
# nulls included); everything else as a plain string, number or boolean.
_JSON = frozenset({"input", "flow_spec", "options", "item", "data"})

_RUN_BODY = ("input", "flow_spec")  # written once; kept apart so per-step cost updates stay small

_RUN_HEAD = tuple(f for f in Run.model_fields if f not in {"steps", *_RUN_BODY})

_STEP_FIELDS = tuple(f for f in Step.model_fields if f not in {"events", "calls", "prompt_layers"})

_ATTEMPT_FIELDS = tuple(Attempt.model_fields)

# An attempt's record on its step item: field -> the short name it is kept under.
_RECORD = {
    "token": "t", "started_at": "s", "resumed_at": "r", "status": "st", "ended_at": "e",
    "reason": "why", "reason_kind": "k", "worker": "w", "heartbeat_at": "hb", "op_id": "op",
}

_RECORD_FIELD = {short: field for field, short in _RECORD.items()}

_ATTEMPT_ATTR = re.compile(r"A(\d+)")

_JOURNAL_ATTR = re.compile(r"J[0-9a-f]{16}")

# Attributes that may move to S3 (never keys, identities or statuses: conditions read those).
_BLOBBABLE = frozenset(
    {
        "input", "flow_spec", "options", "item", "data", "instruction", "message", "result", "conclusion",
        "error", "skip_reason", "reason", "worker", "layers", "text", "body", "why", "w",
    }
)



class ItemTooLarge(InvalidInput):
    """A value too large to keep in a DynamoDB item, and no blob bucket to put it in."""



# -- values --------------------------------------------------------------------------------


def _item_name(item: dict[str, Any]) -> str:
    """An item as a person names it: `run 'ID'` or `step N of run 'ID'`."""
    try:
        _, run_id = _tenant_run(item["pk"]["S"])
        sk = item["sk"]["S"]
    except (KeyError, TypeError, ValueError):
        return "a record"
    return f"step {int(sk[2:])} of run {run_id!r}" if sk.startswith("S#") and sk[2:].isdigit() else f"run {run_id!r}"



def _cost(value: Any) -> Decimal:
    return Decimal(str(round(float(value), COST_DECIMALS)))



def _to_attr(field: str, value: Any) -> Any:
    """A model field's value as it is kept (None: the attribute is absent)."""
    if field in _JSON:
        return _dumps(value)
    if value is None:
        return None
    if field == "cost_usd":
        return _cost(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (bool, int, str, Decimal)):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    raise TypeError(f"DynamoStore does not know how to keep field {field!r} ({type(value).__name__}); add it to _JSON")



def _av(value: Any) -> dict[str, Any]:
    """A Python value as a DynamoDB AttributeValue."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, (int, Decimal)):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, dict):
        return {"M": {k: _av(v) for k, v in value.items()}}
    raise TypeError(f"cannot keep {type(value).__name__} in DynamoDB")



def _number(text: str) -> int | float:
    return int(text) if text.lstrip("-").isdigit() else float(Decimal(text))



def _av_size(av: dict[str, Any]) -> int:
    """Bytes an AttributeValue counts for, by DynamoDB's item-size rules."""
    ((kind, value),) = av.items()
    if kind == "S":
        return len(value.encode())
    if kind == "N":
        digits = len(value.lstrip("-").replace(".", "").strip("0")) or 1
        return math.ceil(digits / 2) + 1
    if kind == "B":
        return len(value)
    if kind == "M":
        return 3 + sum(len(k.encode()) + _av_size(v) + 1 for k, v in value.items())
    if kind == "L":
        return 3 + sum(_av_size(v) + 1 for v in value)
    return 1  # BOOL, NULL



def _item_size(item: dict[str, dict[str, Any]]) -> int:
    return sum(len(name.encode()) + _av_size(av) for name, av in item.items())



def _write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))



def _read_units(size: int) -> int:
    return max(1, math.ceil(size / 4096))



# -- keys ----------------------------------------------------------------------------------


# Every key naming a tenant is built by one of these three, so each checks the tenant: a `#`
# in it would run into the next part of the key (TenantInvalid, a 400, never a 500).
def _pk(tenant: str, run_id: str) -> str:
    return f"T#{check_tenant(tenant)}#R#{run_id}"



def _key(tenant: str, run_id: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": _pk(tenant, run_id)}, "sk": {"S": sk}}



def _step_sk(index: int) -> str:
    return f"S#{index:08d}"



def _attempt_sk(index: int, n: int) -> str:
    return f"A#{index:08d}#{n:06d}"



def _trace_prefix(index: int) -> str:
    return f"T#{index:08d}#"



def _event_sk(index: int, seq: str) -> str:
    return f"{_trace_prefix(index)}E#{seq}"



def _call_sk(index: int, call_id: str) -> str:
    return f"{_trace_prefix(index)}C#{call_id}"



def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]



def _attempt_attr(n: int) -> str:
    return f"A{n}"



def _journal_attr(op_id: str) -> str:
    """The step item's attribute of an op_id's journal entry."""
    return "J" + _digest(op_id)[:16]



def _moved_journal_sk(op_id: str) -> str:
    """Where an op_id's settled entry goes once its step has kept enough."""
    return "J#" + _digest(op_id)[:16]



def _tenant_run(pk: str) -> tuple[str, str]:
    tenant, _, run_id = pk.removeprefix("T#").partition("#R#")
    return tenant, run_id



def _gate_token_prefix(key: str) -> str:
    return f"GT#{_digest(key)}#"



def _runs_pk(tenant: str) -> str:
    return f"T#{check_tenant(tenant)}#RUNS"



def _live_pk(tenant: str, kind: str) -> str:
    return f"T#{check_tenant(tenant)}#LIVE#{kind}"



def _live_sk(run_id: str, index: int) -> str:
    return f"{run_id}#{index:08d}"



_LIVE_KINDS = {"RUN": RUN_SK, "STEP": "S#"}  # kind -> the sk its items start with



class _Sequence:
    """Sortable, unique suffixes: wall-clock nanoseconds, strictly increasing within the
    process (so a thread's events keep their order even within one clock tick), and a random
    tail so two processes never make the same key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self) -> str:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            ns = self._last
        return f"{ns:020d}{secrets.token_hex(3)}"



_SEQUENCE = _Sequence()



# -- expressions ---------------------------------------------------------------------------


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")



class _Expr:
    """The names and values of one request's expressions. Every name is aliased: many of
    ours (status, index, group, data, token, text) are DynamoDB reserved words."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, dict[str, Any]] = {}
        self._aliases: dict[str, str] = {}  # names an alias cannot spell (span ids) -> #_<k>

    def n(self, name: str) -> str:
        if _PLAIN_NAME.fullmatch(name):
            alias = f"#{name}"
        else:
            alias = self._aliases.setdefault(name, f"#_{len(self._aliases)}")
        self.names[alias] = name
        return alias

    def p(self, path: "str | tuple[str, ...]") -> str:
        """An attribute, or a path into a map attribute given as a tuple of names."""
        return self.n(path) if isinstance(path, str) else ".".join(self.n(part) for part in path)

    def v(self, value: Any) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = _av(value)
        return alias

    def exists(self, name: "str | tuple[str, ...]") -> str:
        return f"attribute_exists({self.p(name)})"

    def absent(self, name: "str | tuple[str, ...]") -> str:
        return f"attribute_not_exists({self.p(name)})"

    def eq(self, name: "str | tuple[str, ...]", value: Any) -> str:
        return self.absent(name) if value is None else f"{self.p(name)} = {self.v(value)}"

    def one_of(self, name: str, values: Iterable[str]) -> str:
        aliases = [self.v(v) for v in values]
        if not aliases:  # one of nothing: a condition that never holds
            return f"{self.absent('pk')} AND {self.exists('pk')}"
        return f"{self.n(name)} IN ({', '.join(aliases)})"

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = self.names
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        return out

    def payload(self) -> int:
        return sum(len(v.encode()) for v in self.names.values()) + sum(_av_size(v) for v in self.values.values())



class _Update(_Expr):
    """An UpdateExpression built by naming what to set, add and remove."""

    def __init__(self) -> None:
        super().__init__()
        self._set: list[str] = []
        self._add: list[str] = []
        self._remove: list[str] = []
        self.assigned: dict[str, str] = {}  # value alias -> the attribute it is set to

    def set(self, name: "str | tuple[str, ...]", value: Any) -> "_Update":
        if value is None:
            return self.remove(name)
        alias = self.v(value)
        self.assigned[alias] = name if isinstance(name, str) else name[-1]
        self._set.append(f"{self.p(name)} = {alias}")
        return self

    def set_default(self, name: str, value: Any) -> "_Update":
        alias = self.n(name)
        self._set.append(f"{alias} = if_not_exists({alias}, {self.v(value)})")
        return self

    def add(self, name: str, value: Any) -> "_Update":
        self._add.append(f"{self.n(name)} {self.v(value)}")
        return self

    def remove(self, name: "str | tuple[str, ...]") -> "_Update":
        self._remove.append(self.p(name))
        return self

    def __bool__(self) -> bool:
        return bool(self._set or self._add or self._remove)

    def expression(self) -> str:
        parts = []
        if self._set:
            parts.append("SET " + ", ".join(self._set))
        if self._add:
            parts.append("ADD " + ", ".join(self._add))
        if self._remove:
            parts.append("REMOVE " + ", ".join(self._remove))
        return " ".join(parts)



def _fence(e: _Expr, ref: AttemptRef) -> str:
    """The condition that the step item's attempt `ref.n` is exactly `ref`'s and running."""
    record = _attempt_attr(ref.n)
    return " AND ".join(
        [
            e.eq((record, "t"), ref.token),
            e.eq((record, "s"), ref.started_at),
            e.eq((record, "r"), ref.resumed_at),
            e.eq((record, "st"), AttemptStatus.running.value),
            e.eq("live_n", ref.n),
        ]
    )



def _record_of(item: dict[str, Any] | None, n: int) -> dict[str, Any] | None:
    """Attempt n's record on a step item (its AttributeValue map), if the item keeps it."""
    if item is None:
        return None
    return item.get(_attempt_attr(n), {}).get("M")



def _fence_holds(item: dict[str, Any] | None, ref: AttemptRef) -> bool:
    """What `_fence` asks, of a step item as read."""
    record = _record_of(item, ref.n)
    if record is None or item is None:
        return False
    return (
        record.get("t", {}).get("S") == ref.token
        and record.get("s", {}).get("S") == ref.started_at
        and record.get("r", {}).get("S") == ref.resumed_at
        and record.get("st", {}).get("S") == AttemptStatus.running.value
        and item.get("live_n", {}).get("N") == str(ref.n)
    )



def _attempt_ended(ref: AttemptRef, found: dict[str, Any] | None) -> AttemptEnded:
    what = f"attempt {ref.n} of step {ref.index} of run {ref.run_id!r}"
    record = _record_of(found, ref.n)
    if record is None:
        last = int(found["last_n"]["N"]) if found is not None and "last_n" in found else 0
        return AttemptEnded(f"{what} has ended" if ref.n <= last else f"{what} does not exist")
    status = record.get("st", {}).get("S", "?")
    same = (
        record.get("t", {}).get("S") == ref.token
        and record.get("s", {}).get("S") == ref.started_at
        and record.get("r", {}).get("S") == ref.resumed_at
    )
    if not same:
        return AttemptEnded(f"{what} is not the attempt named (its token or times differ); it is {status}")
    return AttemptEnded(f"{what} has ended ({status})")



def _pending_journal(item: dict[str, Any]) -> int:
    return int(item["jp"]["N"]) if "jp" in item else 0



def _setting(path: "str | tuple[str, ...]", value: Any) -> Callable[[_Update, list[str], dict[str, Any] | None], int]:
    """An attempt write (see `DynamoStore._attempt_write`) that sets one attribute or path."""

    def build(u: _Update, condition: list[str], found: dict[str, Any] | None) -> int:
        u.set(path, value)
        return 0

    return build



def _no_changes(u: _Update, condition: list[str], found: dict[str, Any] | None) -> int:
    return 0



def _plain(**values: Any) -> dict[str, Any]:
    """A map's values, those that are None left out."""
    return {k: v for k, v in values.items() if v is not None}



def _validated(model: type[Run] | type[Step], allowed: frozenset[str], changes: dict[str, Any]) -> dict[str, Any]:
    """The changes, validated against the model's field types (before anything is written)."""
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"{model.__name__.lower()} fields that cannot be changed here: {', '.join(unknown)}")
    return {field: _field_adapter(model, field).validate_python(value) for field, value in changes.items()}



# -- refusals ------------------------------------------------------------------------------


class _Refused(Exception):
    """A conditional write (or one action of a transaction) was refused. `reasons` has one
    entry per action: its code ('None' when it was fine) and the item as it was found."""

    def __init__(self, reasons: list[dict[str, Any]]):
        super().__init__(reasons)
        self.reasons = reasons

    def failed(self, action: int) -> bool:
        return self.reasons[action].get("Code") == "ConditionalCheckFailed"

    def found(self, action: int) -> dict[str, Any] | None:
        return self.reasons[action].get("Item") or None



def _too_large(message: str, bucket: str | None) -> ItemTooLarge:
    if bucket:
        return ItemTooLarge(f"an item would pass DynamoDB's 400 KB even with its large values in s3://{bucket}: {message}")
    return ItemTooLarge(
        f"a value is too large for a DynamoDB item (at most 400 KB) and no blob bucket is configured"
        f" (use dynamodb://TABLE?bucket=BUCKET): {message}"
    )



# -- capacity ------------------------------------------------------------------------------


class _Meter:
    """Capacity units and requests by operation (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._units: dict[str, defaultdict[str, float]] = {"read": defaultdict(float), "write": defaultdict(float)}
        self._requests: defaultdict[str, int] = defaultdict(int)

    def count(self, op: str, *, read: float = 0.0, write: float = 0.0) -> None:
        with self._lock:
            self._requests[op] += 1
            if read:
                self._units["read"][op] += read
            if write:
                self._units["write"][op] += write

    def snapshot(self, reset: bool = False) -> dict[str, dict[str, float]]:
        with self._lock:
            out = {"read": dict(self._units["read"]), "write": dict(self._units["write"]), "requests": dict(self._requests)}
            if reset:
                self._reset()
            return out



_F = TypeVar("_F", bound=Callable[..., Any])



def _operation(method: _F) -> _F:
    """Count the capacity a public method's requests consume under its name (a method
    called by another counts under the outer one)."""

    @wraps(method)
    def wrapper(self: "DynamoStore", *args: Any, **kwargs: Any) -> Any:
        if getattr(self._op, "name", None):
            return method(self, *args, **kwargs)
        self._op.name = method.__name__
        try:
            return method(self, *args, **kwargs)
        finally:
            self._op.name = None

    return wrapper  # type: ignore[return-value]



# -- the store -----------------------------------------------------------------------------

_SESSION_LOCK = threading.Lock()



@cache
def _shared_session() -> boto3.session.Session:
    """One boto3 session per process, so every store's clients share its parsed service
    models (a session per store parses them again: ~100 ms a store)."""
    return boto3.session.Session()



class DynamoStore(Store):
    """The DynamoDB store (see the module docstring for the item layout and its reasons).

    `table` must exist with template.yaml's RunsTable key schema and indexes. `bucket` (an S3
    bucket) receives values over `blob_threshold` bytes; without one, a value that would
    push an item past ~350 KB raises `ItemTooLarge`. Credentials, region and endpoints come
    from boto3's usual configuration (AWS_REGION, AWS_ENDPOINT_URL_DYNAMODB, ...), `region`
    overriding the region. Safe to use from many threads: the clients are made once."""

    def __init__(
        self,
        table: str,
        *,
        bucket: str | None = None,
        region: str | None = None,
        blob_threshold: int = BLOB_THRESHOLD,
        session: boto3.session.Session | None = None,
    ) -> None:
        if not table:
            raise InvalidInput("a DynamoDB store needs a table name: dynamodb://TABLE")
        session = session or _shared_session()
        region = region or session.region_name
        if not region:
            raise InvalidInput(
                f"no AWS region for the DynamoDB table {table!r}: set AWS_REGION or use dynamodb://{table}?region=REGION"
            )
        config = Config(retries={"mode": "standard", "max_attempts": 8}, max_pool_connections=64)
        with _SESSION_LOCK:  # a session is not thread-safe; the clients it makes are
            self._db = session.client("dynamodb", region_name=region, config=config)
            self._s3 = session.client("s3", region_name=region, config=config)
        self.table = table
        self.bucket = bucket
        self.region = region
        self.blob_threshold = blob_threshold
        query = "&".join(f"{k}={v}" for k, v in (("bucket", bucket), ("region", region)) if v)
        self.url = f"dynamodb://{table}" + (f"?{query}" if query else "")
        self._meter = _Meter()
        self._op = threading.local()

    def __repr__(self) -> str:
        return f"DynamoStore({self.table!r}, bucket={self.bucket!r}, region={self.region!r})"

    def close(self) -> None:
        self._db.close()
        self._s3.close()

    def consumed(self, *, reset: bool = False) -> dict[str, dict[str, float]]:
        """Capacity units by operation since the store was opened (or last reset):
        {"read": {op: RCU}, "write": {op: WCU}, "requests": {op: count}}."""
        return self._meter.snapshot(reset)

    # -- requests -----------------------------------------------------------------------

    def _count(self, *, read: float = 0.0, write: float = 0.0) -> None:
        self._meter.count(getattr(self._op, "name", None) or "other", read=read, write=write)

    def _request(self, method: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB request; a refused condition raises `_Refused`, an item too large
        `ItemTooLarge`."""
        try:
            return getattr(self._db, method)(TableName=self.table, **kwargs)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            message = error.response.get("Error", {}).get("Message", "")
            if code == "ConditionalCheckFailedException":
                raise _Refused([{"Code": "ConditionalCheckFailed", "Item": error.response.get("Item")}]) from None
            if code == "ValidationException" and "size" in message.lower():
                raise _too_large(message, self.bucket) from None
            raise

    def _get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        item = self._request("get_item", Key=key, ConsistentRead=True).get("Item")
        self._count(read=_read_units(_item_size(item) if item else 0))
        return item

    def _query(self, *, index: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item a Query names, page by page (strongly consistent on the table)."""
        items: list[dict[str, Any]] = []
        params = dict(kwargs, **({"IndexName": index} if index else {"ConsistentRead": True}))
        while True:
            page = self._request("query", **params)
            items += page.get("Items", [])
            size = sum(_item_size(i) for i in page.get("Items", []))
            self._count(read=_read_units(size) * (0.5 if index else 1.0))
            if "LastEvaluatedKey" not in page:
                return items
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _query_prefix(self, pk: str, prefix: str, *, where: Callable[[_Expr], str] | None = None) -> list[dict[str, Any]]:
        """The items of a partition whose sort key starts with `prefix` (and that `where`,
        given the request's expression, filters in)."""
        e = _Expr()
        params: dict[str, Any] = {"KeyConditionExpression": f"{e.n('pk')} = {e.v(pk)} AND begins_with({e.n('sk')}, {e.v(prefix)})"}
        if where is not None:
            params["FilterExpression"] = where(e)
        return self._query(**params, **e.params())

    def _query_range(self, pk: str, low: str, high: str | None = None) -> list[dict[str, Any]]:
        e = _Expr()
        sk = e.n("sk")
        between = f"{sk} BETWEEN {e.v(low)} AND {e.v(high)}" if high else f"{sk} >= {e.v(low)}"
        return self._query(KeyConditionExpression=f"{e.n('pk')} = {e.v(pk)} AND {between}", **e.params())

    def _batch_get(self, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items of `keys` (strongly consistent), in no particular order."""
        items: list[dict[str, Any]] = []
        for start in range(0, len(keys), 100):
            pending: dict[str, Any] = {self.table: {"Keys": keys[start : start + 100], "ConsistentRead": True}}
            for attempt in range(10):
                page = self._db.batch_get_item(RequestItems=pending)
                got = page.get("Responses", {}).get(self.table, [])
                items += got
                self._count(read=sum(_read_units(_item_size(i)) for i in got))
                pending = page.get("UnprocessedKeys") or {}
                if not pending:
                    break
                time.sleep(min(1.0, 0.01 * 2**attempt))
        return items

    def _put(self, item: dict[str, Any], condition: str | None = None, e: _Expr | None = None, *, indexes: int = 0) -> None:
        extra: dict[str, Any] = {}
        if condition:
            extra = {"ConditionExpression": condition, "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **(e or _Expr()).params()}
        self._request("put_item", Item=item, **extra)
        self._count(write=_write_units(_item_size(item)) + indexes)

    def _update(
        self,
        key: dict[str, Any],
        u: _Update,
        condition: str | None = None,
        *,
        returns: str = "NONE",
        indexes: "int | Callable[[dict[str, Any]], int]" = 0,
        blobs: "_Blobs | None" = None,
        size: int = 0,
    ) -> dict[str, Any] | None:
        """One UpdateItem. If the item would pass 400 KB with what it already holds (the
        store sees only what it writes) and `blobs` can take them, the write's large values go
        to S3 and it is made once more. Counted on the larger of `size` (the item as read
        before) and the item after it (ALL_NEW) or what it writes; `indexes` may be decided
        from the item after it."""
        extra: dict[str, Any] = {}
        if condition:
            extra = {"ConditionExpression": condition, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}

        def request() -> dict[str, Any]:
            return self._request("update_item", Key=key, UpdateExpression=u.expression(), ReturnValues=returns, **u.params(), **extra)

        try:
            reply = request()
        except ItemTooLarge:
            if blobs is None or not blobs.squeeze(key["sk"]["S"], u):
                raise
            reply = request()
        item = reply.get("Attributes")
        written = _item_size(item) if item and returns == "ALL_NEW" else _item_size(key) + u.payload()
        index_writes = indexes(item or {}) if callable(indexes) else indexes
        self._count(write=_write_units(max(size, written)) + index_writes)
        return item

    def _transact(
        self,
        actions: list[tuple[dict[str, Any], int]],
        *,
        indexes: int = 0,
        squeeze: "tuple[_Blobs, list[tuple[str, _Update]]] | None" = None,
    ) -> None:
        """One TransactWriteItems of (action, size) pairs: all land or none. A refused
        condition raises `_Refused` with a reason per action; a conflict with a concurrent
        transaction on the same items is retried; an item that would pass 400 KB gets the
        large values of `squeeze`'s updates moved to S3 and is tried once more."""
        try:
            self._transact_once(actions, indexes)
        except ItemTooLarge:
            if squeeze is None:
                raise
            blobs, updates = squeeze
            if not any([blobs.squeeze(sk, u) for sk, u in updates]):
                raise
            self._transact_once(actions, indexes)

    def _transact_once(self, actions: list[tuple[dict[str, Any], int]], indexes: int) -> None:
        items = []
        for action, _ in actions:
            ((kind, body),) = action.items()
            body = dict(body, TableName=self.table)
            if "ConditionExpression" in body:
                body["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            items.append({kind: body})
        for attempt in range(10):
            try:
                self._db.transact_write_items(TransactItems=items)
                break
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                reasons = error.response.get("CancellationReasons") or []
                codes = {r.get("Code") for r in reasons}
                message = " ".join([error.response.get("Error", {}).get("Message", "")] + [r.get("Message") or "" for r in reasons])
                if code == "TransactionCanceledException" and "ConditionalCheckFailed" in codes:
                    raise _Refused(reasons) from None
                if (code == "ValidationException" or "ValidationError" in codes) and "size" in message.lower():
                    raise _too_large(message, self.bucket) from None
                conflict = code == "TransactionConflictException" or (
                    code == "TransactionCanceledException" and codes <= {"None", "TransactionConflict", None}
                )
                if not conflict:
                    raise
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        else:
            raise Conflict("a write kept conflicting with concurrent writes to the same items; try again")
        self._count(write=2 * sum(_write_units(size) for _, size in actions) + indexes)

    def _tx_put(self, item: dict[str, Any], condition: str | None = None, e: _Expr | None = None) -> tuple[dict[str, Any], int]:
        body: dict[str, Any] = {"Item": item}
        if condition:
            body.update(ConditionExpression=condition, **(e or _Expr()).params())
        return {"Put": body}, _item_size(item)

    def _tx_update(
        self, key: dict[str, Any], u: _Update, condition: str | None = None, *, size: int | None = None
    ) -> tuple[dict[str, Any], int]:
        body: dict[str, Any] = {"Key": key, "UpdateExpression": u.expression(), **u.params()}
        if condition:
            body["ConditionExpression"] = condition
        return {"Update": body}, size if size is not None else _item_size(key) + u.payload()

    def _tx_check(self, key: dict[str, Any], e: _Expr, condition: str) -> tuple[dict[str, Any], int]:
        return {"ConditionCheck": {"Key": key, "ConditionExpression": condition, **e.params()}}, 1024

    # -- blobs ----------------------------------------------------------------------------

    @contextmanager
    def _blobs(self, tenant: str, run_id: str) -> Iterator["_Blobs"]:
        """Where one write's large values go; what it uploaded is deleted if it fails."""
        blobs = _Blobs(self, tenant, run_id)
        try:
            yield blobs
        except BaseException:
            blobs.undo()
            raise

    def _text(self, av: dict[str, Any]) -> Any:
        """A stored attribute as Python, reading a blob from S3 when it is a pointer."""
        if "S" in av:
            return av["S"]
        if "N" in av:
            return _number(av["N"])
        if "BOOL" in av:
            return av["BOOL"]
        if "M" in av and "s3" in av["M"]:
            bucket, _, key = av["M"]["s3"]["S"].removeprefix("s3://").partition("/")
            return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        if "NULL" in av:
            return None
        raise TypeError(f"unexpected attribute {av!r}")

    def _fields(self, item: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
        """The named model fields of an item (absent ones left to the model's defaults).
        `RecordDamaged` naming the item and the field when a JSON field does not parse
        (strictly: a NaN no entrance lets in now is damage too)."""
        out: dict[str, Any] = {}
        for name in names:
            if name in item:
                value = self._text(item[name])
                if name in _JSON:
                    try:
                        value = jsonsafe.parse_stored(value)
                    except (TypeError, ValueError):
                        raise RecordDamaged(f"{_item_name(item)} cannot be read from the store: its {name} is not valid JSON") from None
                out[name] = value
        return out

    # -- items ----------------------------------------------------------------------------

    @staticmethod
    def _attrs(model: Any, fields: Iterable[str]) -> dict[str, Any]:
        return {f: v for f in fields if (v := _to_attr(f, getattr(model, f))) is not None}

    def _step_items(self, blobs: "_Blobs", tenant: str, run_id: str, step: Step) -> list[dict[str, Any]]:
        """A step record with whatever events, calls and layers it carries (the layers and
        the spans that fit in the step item, the rest as items)."""
        pk = {"pk": _pk(tenant, run_id)}
        head = {**pk, "sk": _step_sk(step.index), **self._attrs(step, _STEP_FIELDS)}
        if step.prompt_layers:
            head["layers"] = _layers_json(step.prompt_layers)
        inline: dict[str, str] = {}
        spans: dict[str, dict[str, Any]] = {}
        for call in step.calls:
            body = call.model_dump_json()
            if len(body.encode()) <= CALL_INLINE_MAX and (call.id in inline or len(inline) < CALLS_ON_STEP):
                inline[call.id] = body
                spans.pop(call.id, None)
            else:
                spans[call.id] = {**pk, "sk": _call_sk(step.index, call.id), "n": call.n, "body": body}
                inline.pop(call.id, None)
        head["calls"] = inline  # always there, so a span can be set into it by path
        items = [blobs.item(head)]
        for event in step.events:
            items.append(blobs.item({**pk, "sk": _event_sk(step.index, _SEQUENCE.next()), **self._event_attrs(event, event.attempt)}))
        items += [blobs.item(span) for span in spans.values()]
        return items

    @staticmethod
    def _event_attrs(event: Event, attempt: int | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"t": event.t, "type": event.type, "text": event.text}
        if attempt is not None:
            attrs["attempt"] = attempt
        if event.data is not None:
            attrs["data"] = _dumps(event.data)
        return attrs

    def _run_of(self, head: dict[str, Any], body: dict[str, Any] | None, steps: list[dict[str, Any]] | None = None) -> Run:
        fields = self._fields(head, _RUN_HEAD)
        if body is not None:
            fields.update(self._fields(body, _RUN_BODY))
        try:
            return Run.model_validate({**fields, "steps": steps or []})
        except ValidationError as e:
            raise _misfit(_item_name(head), e) from None

    def _step_of(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._fields(item, _STEP_FIELDS)

    @staticmethod
    def _step_model(item: dict[str, Any], fields: dict[str, Any]) -> Step:
        try:
            return Step.model_validate(fields)
        except ValidationError as e:
            raise _misfit(_item_name(item), e) from None

    def _attempt_of(self, item: dict[str, Any]) -> Attempt:
        return Attempt.model_validate(self._fields(item, _ATTEMPT_FIELDS))

    def _with_trace(self, steps: dict[int, dict[str, Any]], raw: dict[int, dict[str, Any]], trace: list[dict[str, Any]]) -> None:
        """Attach events (in key order: the order written), calls (by n: the step item's,
        then span items of ids it does not hold) and prompt layers to step dicts."""
        events: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
        spans: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
        for item in trace:
            sk = item["sk"]["S"]
            index, kind = int(sk[2:10]), sk[11]
            if kind == "E":
                events[index].append(self._fields(item, ("t", "type", "text", "attempt", "data")))
            elif kind == "C":
                spans[index].append(item)
        for index, step in steps.items():
            item = raw[index]
            calls = {call_id: json.loads(self._text(av)) for call_id, av in item.get("calls", {}).get("M", {}).items()}
            for span in spans[index]:
                call_id = span["sk"]["S"][len(_call_sk(index, "")) :]
                if call_id not in calls:
                    calls[call_id] = json.loads(self._text(span["body"]))
            step["events"] = events[index]
            step["calls"] = sorted(calls.values(), key=lambda c: (c.get("n", 1), c["id"]))
            step["prompt_layers"] = json.loads(self._text(item["layers"])) if "layers" in item else []

    # -- attempts and journal entries on a step item -------------------------------------------

    def _record_attempt(self, run_id: str, index: int, n: int, record: dict[str, Any]) -> Attempt:
        fields = {_RECORD_FIELD[short]: self._text(av) for short, av in record.items() if short in _RECORD_FIELD}
        return Attempt(run_id=run_id, index=index, n=n, **fields)

    def _records(self, item: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """The attempt records a step item keeps, by n."""
        return {int(m.group(1)): av["M"] for name, av in item.items() if (m := _ATTEMPT_ATTR.fullmatch(name))}

    def _attempts_on(self, item: dict[str, Any]) -> list[Attempt]:
        _, run_id = _tenant_run(item["pk"]["S"])
        index = int(item["index"]["N"])
        return [self._record_attempt(run_id, index, n, record) for n, record in sorted(self._records(item).items())]

    def _attempt_at(self, tenant: str, run_id: str, index: int, n: int, item: dict[str, Any] | None = None) -> Attempt:
        """Attempt n: from its step item (read here unless given) or, moved, its own item."""
        if item is None:
            item = self._get(_key(tenant, run_id, _step_sk(index)))
        record = _record_of(item, n)
        if record is not None:
            return self._record_attempt(run_id, index, n, record)
        moved = self._get(_key(tenant, run_id, _attempt_sk(index, n)))
        if moved is None:
            raise NotFound(f"no attempt {n} of step {index} in run {run_id!r}")
        return self._attempt_of(moved)

    def _entry_on(self, tenant: str, run_id: str, op_id: str, item: dict[str, Any]) -> JournalEntry | None:
        """The journal entry of `op_id` a step item keeps, if it does."""
        av = item.get(_journal_attr(op_id))
        if av is None:
            return None
        m, index = av["M"], int(item["index"]["N"])
        entry = JournalEntry(
            tenant=tenant, run_id=run_id, op_id=op_id, index=index, status=m["s"]["S"], created_at=m["c"]["S"], expires_at=int(m["x"]["N"])
        )
        if entry.status == JournalStatus.completed:
            got = self._attempt_at(tenant, run_id, index, int(m["n"]["N"]), item)
            identity = {"attempt": got.n, "token": got.token, "started_at": got.started_at, "resumed_at": got.resumed_at}
            entry = entry.model_copy(update=identity)
        return entry

    def _moved_entry(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        """The journal entry of `op_id` moved off its step, if it was."""
        item = self._get(_key(tenant, run_id, _moved_journal_sk(op_id)))
        if item is None:
            return None
        fields = self._fields(item, ("index", "status", "attempt", "created_at", "expires_at"))
        entry = JournalEntry(tenant=tenant, run_id=run_id, op_id=op_id, **fields)
        if entry.attempt is not None:
            got = self._attempt_at(tenant, run_id, entry.index, entry.attempt)
            entry = entry.model_copy(update={"token": got.token, "started_at": got.started_at, "resumed_at": got.resumed_at})
        return entry

    def _journal_step(self, tenant: str, run_id: str, op_id: str) -> dict[str, Any] | None:
        """The step item keeping `op_id`'s journal entry: a Query of the run's steps, filtered
        (the journal is not told which step an op_id names)."""
        e = _Expr()
        items = self._query(
            KeyConditionExpression=f"{e.n('pk')} = {e.v(_pk(tenant, run_id))} AND {e.n('sk')} BETWEEN {e.v('S#')} AND {e.v(STEPS_END)}",
            FilterExpression=e.exists(_journal_attr(op_id)),
            **e.params(),
        )
        return items[0] if items else None

    def _require_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        head = self._get(_key(tenant, run_id, RUN_SK))
        if head is None or "hidden" in head:
            raise RunNotFound(run_id)
        return head

    def _require_step(self, tenant: str, run_id: str, index: int) -> dict[str, Any]:
        item = self._get(_key(tenant, run_id, _step_sk(index)))
        if item is None:
            self._require_run(tenant, run_id)
            raise NotFound(f"no step {index} in run {run_id!r}")
        return item

    # -- runs -------------------------------------------------------------------------------

    @_operation
    def create_run(self, run: Run) -> None:
        pk = _pk(run.tenant, run.id)
        seq = f"{run.created_at}#{_SEQUENCE.next()}"
        head = {"pk": pk, "sk": RUN_SK, **self._attrs(run, _RUN_HEAD), "lpk": _runs_pk(run.tenant), "lsk": seq, "vsk": seq}
        if run.status.value in _ACTIVE_RUN:
            head["vpk"] = _live_pk(run.tenant, "RUN")
        with self._blobs(run.tenant, run.id) as blobs:
            head = blobs.item(head)
            rest = [blobs.item({"pk": pk, "sk": INPUT_SK, **{f: _dumps(getattr(run, f)) for f in _RUN_BODY}})]
            for step in run.steps:
                rest += self._step_items(blobs, run.tenant, run.id, step)
            indexes = 1 + ("vpk" in head)
            e = _Expr()
            new = e.absent("pk")
            items = [_encode(head)] + [_encode(i) for i in rest]
            if len(items) <= TRANSACTION_ITEMS and sum(_item_size(i) for i in items) <= TRANSACTION_BYTES:
                try:
                    self._transact([self._tx_put(items[0], new, e)] + [self._tx_put(i) for i in items[1:]], indexes=indexes)
                except _Refused:
                    raise Conflict(f"run {run.id!r} exists") from None
                return
            self._create_large(run, head, items[1:], indexes)

    def _create_large(self, run: Run, head: dict[str, Any], rest: list[dict[str, Any]], indexes: int) -> None:
        """More than one transaction holds: write the run hidden (its id taken, reading as
        absent), then its items, then reveal it in one update."""
        reveal = _Update()
        hidden = dict(head, hidden=True)
        for name in ("lpk", "vpk"):
            if name in hidden:
                reveal.set(name, hidden.pop(name))
        reveal.remove("hidden")
        e = _Expr()
        try:
            self._put(_encode(hidden), e.absent("pk"), e)
        except _Refused:
            raise Conflict(f"run {run.id!r} exists") from None
        for start in range(0, len(rest), 25):
            pending: dict[str, Any] = {self.table: [{"PutRequest": {"Item": i}} for i in rest[start : start + 25]]}
            for attempt in range(10):
                reply = self._db.batch_write_item(RequestItems=pending)
                pending = reply.get("UnprocessedItems") or {}
                if not pending:
                    break
                time.sleep(min(1.0, 0.01 * 2**attempt))
            else:
                raise RuntimeError(f"run {run.id!r}: DynamoDB kept refusing its items; the run stays hidden")
            self._count(write=sum(_write_units(_item_size(i)) for i in rest[start : start + 25]))
        self._update(_key(run.tenant, run.id, RUN_SK), reveal, indexes=indexes)

    @_operation
    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True) -> Run:
        pk = _pk(tenant, run_id)
        if not steps:
            items = self._query_prefix(pk, RUN_SK)
        elif not detail:
            items = self._query_range(pk, RUN_SK, STEPS_END)
        else:
            items = self._query_range(pk, RUN_SK)
        head = body = None
        step_items: dict[int, dict[str, Any]] = {}
        raw: dict[int, dict[str, Any]] = {}
        trace = []
        for item in items:
            sk = item["sk"]["S"]
            if sk == RUN_SK:
                head = item
            elif sk == INPUT_SK:
                body = item
            elif sk.startswith("S#"):
                step = self._step_of(item)
                step_items[step["index"]] = step
                raw[step["index"]] = item
            elif sk.startswith("T#"):
                trace.append(item)
        if head is None or "hidden" in head:
            raise RunNotFound(run_id)
        if detail and steps:
            try:
                self._with_trace(step_items, raw, trace)
            except (KeyError, TypeError, ValueError):
                raise RecordDamaged(f"run {run_id!r} cannot be read from the store: its trace does not parse") from None
        return self._run_of(head, body, [step_items[i] for i in sorted(step_items)])

    @_operation
    def list_runs(self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None) -> list[Run]:
        wanted = set(_statuses(status)) if status is not None else None
        if wanted is not None and not wanted:
            return []
        e = _Expr()
        params: dict[str, Any] = {
            "KeyConditionExpression": f"{e.n('lpk')} = {e.v(_runs_pk(tenant))}",
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if wanted is not None:
            params["FilterExpression"] = e.one_of("status", sorted(wanted))
        params.update(e.params())
        keys: list[tuple[str, str]] = []
        while len(keys) < limit:
            page = self._request("query", IndexName=BY_TENANT_INDEX, **params)
            self._count(read=0.5 * _read_units(sum(_item_size(i) for i in page.get("Items", []))))
            keys += [(i["pk"]["S"], i["lsk"]["S"]) for i in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        runs = self._runs([pk for pk, _ in keys[:limit]])
        return [r for r in runs if wanted is None or r.status.value in wanted]

    def _runs(self, pks: list[str]) -> list[Run]:
        """The runs of these partition keys, in this order (those gone or hidden left out)."""
        items = self._batch_get([{"pk": {"S": pk}, "sk": {"S": sk}} for pk in pks for sk in (RUN_SK, INPUT_SK)])
        found = {(i["pk"]["S"], i["sk"]["S"]): i for i in items}
        out = []
        for pk in pks:
            head = found.get((pk, RUN_SK))
            if head is not None and "hidden" not in head:
                try:
                    out.append(self._run_of(head, found.get((pk, INPUT_SK))))
                except RecordDamaged as damaged:  # one damaged run never stops a list (or reconcile)
                    log.warning("%s left out: %s", _item_name(head), damaged)
        return out

    @_operation
    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: dict[str, Any],
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_cost: float = 0.0,
        add_drives: int = 0,
    ) -> Run:
        values = _validated(Run, RUN_FIELDS, changes)
        if add_cost and "cost_usd" in values:
            values["cost_usd"] = values["cost_usd"] + add_cost
            add_cost = 0.0
        if add_drives and "drives" in values:
            values["drives"] = values["drives"] + add_drives
            add_drives = 0
        key = _key(tenant, run_id, RUN_SK)
        u = _Update()
        with self._blobs(tenant, run_id) as blobs:
            for field, value in blobs.attrs(RUN_SK, {f: _to_attr(f, v) for f, v in values.items()}).items():
                u.set(field, value)
            if add_cost:
                u.add("cost_usd", _cost(add_cost))
            if add_drives:
                u.add("drives", int(add_drives))
            indexes = 0
            if "status" in values:
                active = values["status"].value in _ACTIVE_RUN
                u.set("vpk", _live_pk(tenant, "RUN") if active else None)
                indexes = 2  # the status the by-tenant index projects, and the live entry
            if not u:
                head = self._require_run(tenant, run_id)
                if expect_status is not None and head["status"]["S"] not in _statuses(expect_status):
                    raise _refuse_status(f"run {run_id!r}", head["status"]["S"], expect_status)
            else:
                condition = [u.exists("pk"), u.absent("hidden")]
                if expect_status is not None:
                    condition.append(u.one_of("status", _statuses(expect_status)))
                try:
                    head = self._update(key, u, " AND ".join(condition), returns="ALL_NEW", indexes=indexes, blobs=blobs)
                except _Refused as refused:
                    found = refused.found(0)
                    if found is None or "hidden" in found:
                        raise RunNotFound(run_id) from None
                    raise _refuse_status(f"run {run_id!r}", found["status"]["S"], expect_status or ()) from None
        return self._run_of(head, self._get(_key(tenant, run_id, INPUT_SK)))  # type: ignore[arg-type]

    @_operation
    def request_stop(self, tenant: str, run_id: str) -> bool:
        u = _Update().set("stop_requested", True)
        try:
            self._update(_key(tenant, run_id, RUN_SK), u, f"{u.exists('pk')} AND {u.n('stop_requested')} <> {u.v(True)}")
        except _Refused as refused:
            found = refused.found(0)
            if found is None or "hidden" in found:
                raise RunNotFound(run_id) from None
            return False
        return True

    # -- steps ------------------------------------------------------------------------------

    @_operation
    def get_steps(self, tenant: str, run_id: str, *, group: int | None = None) -> list[Step]:
        e = _Expr()
        steps = f"{e.n('pk')} = {e.v(_pk(tenant, run_id))} AND {e.n('sk')} BETWEEN {e.v('S#')} AND {e.v(STEPS_END)}"
        params: dict[str, Any] = {"KeyConditionExpression": steps}
        if group is not None:
            params["FilterExpression"] = e.eq("group", group)
        items = self._query(**params, **e.params())
        if not items:
            self._require_run(tenant, run_id)
        return [self._step_model(i, self._step_of(i)) for i in items]

    @_operation
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        item = self._require_step(tenant, run_id, index)
        step = self._step_of(item)
        if detail:
            try:
                self._with_trace({index: step}, {index: item}, self._query_prefix(_pk(tenant, run_id), _trace_prefix(index)))
            except (KeyError, TypeError, ValueError):
                raise RecordDamaged(f"{_item_name(item)} cannot be read from the store: its trace does not parse") from None
        return self._step_model(item, step)

    @_operation
    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        with self._blobs(tenant, run_id) as blobs:
            items = [_encode(i) for step in steps for i in self._step_items(blobs, tenant, run_id, step)]
            if len(items) + 1 > TRANSACTION_ITEMS:
                raise ValueError(
                    f"add_steps writes at most {TRANSACTION_ITEMS - 1} items at once (steps with their trace); got {len(items)}"
                )
            run = _Expr()
            actions = [self._tx_check(_key(tenant, run_id, RUN_SK), run, f"{run.exists('pk')} AND {run.absent('hidden')}")]
            for item in items:
                if item["sk"]["S"].startswith("S#"):
                    e = _Expr()
                    actions.append(self._tx_put(item, e.absent("pk"), e))
                else:
                    actions.append(self._tx_put(item))
            try:
                self._transact(actions)
            except _Refused as refused:
                if refused.failed(0):
                    raise RunNotFound(run_id) from None
                raise Conflict(f"run {run_id!r}: a step index among {[s.index for s in steps]} is taken") from None

    @_operation
    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: dict[str, Any],
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        values = _validated(Step, STEP_FIELDS, changes)
        what = f"step {index} of run {run_id!r}"
        if not values:
            step = self._step_of(self._require_step(tenant, run_id, index))
            if expect_status is not None and step["status"] not in _statuses(expect_status):
                raise _refuse_status(what, step["status"], expect_status)
            return Step.model_validate(step)
        u = _Update()
        with self._blobs(tenant, run_id) as blobs:
            for field, value in blobs.attrs(_step_sk(index), {f: _to_attr(f, v) for f, v in values.items()}).items():
                u.set(field, value)
            condition = [u.exists("pk")]
            if expect_status is not None:
                condition.append(u.one_of("status", _statuses(expect_status)))
            try:
                item = self._update(_key(tenant, run_id, _step_sk(index)), u, " AND ".join(condition), returns="ALL_NEW", blobs=blobs)
            except _Refused as refused:
                found = refused.found(0)
                if found is None:
                    self._require_run(tenant, run_id)
                    raise NotFound(f"no step {index} in run {run_id!r}") from None
                raise _refuse_status(what, found["status"]["S"], expect_status or ()) from None
        return Step.model_validate(self._step_of(item))  # type: ignore[arg-type]

    # -- attempts ---------------------------------------------------------------------------

    @_operation
    def claim_attempt(
        self,
        tenant: str,
        run_id: str,
        index: int,
        *,
        token: str,
        started_at: str,
        op_id: str | None = None,
        resumed_at: str | None = None,
        expect_status: Collection[StepStatus] = (StepStatus.pending,),
        journal_ttl_s: int = 7 * 24 * 3600,
        worker: str | None = None,
        layers: list[PromptLayer] | None = None,
        message: str | None = None,
    ) -> Attempt:
        expected = _statuses(expect_status)
        what = f"step {index} of run {run_id!r}"
        sk = _step_sk(index)
        key = _key(tenant, run_id, sk)
        journal = _journal_attr(op_id) if op_id is not None else None
        with self._blobs(tenant, run_id) as blobs:
            kept = blobs.attrs(sk, {"w": worker, "layers": None if layers is None else _layers_json(layers), "message": message})
            for _ in range(20):  # another writer changed the step between our read and our write
                found = self._require_step(tenant, run_id, index)
                entry = None
                if op_id is not None:
                    entry = self._entry_on(tenant, run_id, op_id, found)
                    if entry is None and "jm" in found:
                        entry = self._moved_entry(tenant, run_id, op_id)
                    if entry is not None and entry.status == JournalStatus.completed:
                        # A re-delivered invocation: it gets what the first one got, nothing new.
                        return self._attempt_at(tenant, run_id, index, entry.attempt or 0, found)
                    if entry is not None and entry.status == JournalStatus.cancelled:
                        raise Conflict(f"operation {op_id!r} was cancelled: its claim never landed")
                status = found["status"]["S"]
                if status not in expected:
                    raise _refuse_status(what, status, expect_status)
                if "live_n" in found:
                    raise Conflict(f"{what} already has a running attempt ({found['live_n']['N']})")
                attempts = _number(found["attempts"]["N"]) if "attempts" in found else 0
                last_n = _number(found["last_n"]["N"]) if "last_n" in found else None
                # Normally attempts + 1. Should a loop reset lower `attempts`, numbers still go up:
                # an attempt's number is part of its identity and is never reused.
                n = max(attempts, last_n or 0) + 1
                u = _Update().set("status", StepStatus.running.value).set("attempts", n).set("last_n", n).set("live_n", n)
                u.set_default("started_at", started_at)
                running = AttemptStatus.running.value
                u.set(_attempt_attr(n), _plain(t=token, s=started_at, r=resumed_at, st=running, w=kept["w"], op=op_id))
                if layers is not None:
                    u.set("layers", kept["layers"])
                if message is not None:
                    u.set("message", kept["message"])
                # The step's live entry: made by journal_begin (then this leaves it as it is) or here.
                u.set("vpk", _live_pk(tenant, "STEP")).set("vsk", _live_sk(run_id, index))
                condition = [u.one_of("status", expected), u.absent("live_n"), u.eq("attempts", attempts), u.eq("last_n", last_n)]
                if journal is not None:
                    if entry is None:  # no journal_begin: the claim makes its entry
                        created, expires = utcnow(), int(time.time()) + journal_ttl_s
                        condition += [u.absent(journal), u.eq("jm", _number(found["jm"]["N"]) if "jm" in found else None)]
                    else:  # pending: completed now, no longer counted as pending
                        created, expires = entry.created_at, entry.expires_at
                        condition.append(u.eq((journal, "s"), JournalStatus.pending.value))
                        u.add("jp", -1)
                    u.set(journal, {"s": JournalStatus.completed.value, "n": n, "c": created, "x": expires})
                self._keep_step_small(tenant, run_id, index, found, u, journal)
                try:
                    self._update(
                        key, u, " AND ".join(condition), returns="ALL_NEW", size=_item_size(found),
                        indexes=0 if "vpk" in found else 1, blobs=blobs,
                    )
                except _Refused:
                    continue  # read again: the refusal's reason is what the step now says
                return Attempt(
                    run_id=run_id, index=index, n=n, token=token, started_at=started_at, resumed_at=resumed_at, op_id=op_id,
                    worker=worker,
                )
        raise Conflict(f"{what} kept changing while it was claimed; try again")

    def _keep_step_small(
        self, tenant: str, run_id: str, index: int, found: dict[str, Any], u: _Update, journal: str | None
    ) -> None:
        """Before a claim adds an attempt record (and a journal entry) to a step item: copy
        the oldest records and settled entries past what a step keeps to items of their own
        (they never change again, so a copy left by a refused claim is never stale) and
        remove them in the claim; drop settled entries past their expiry, as TTL would."""
        pk = {"S": _pk(tenant, run_id)}
        records = self._records(found)
        for n in sorted(records)[: max(0, len(records) + 1 - ATTEMPTS_ON_STEP)]:
            moved = {"pk": pk, "sk": {"S": _attempt_sk(index, n)}, "run_id": {"S": run_id}, "index": {"N": str(index)}, "n": {"N": str(n)}}
            moved.update({_RECORD_FIELD[short]: av for short, av in records[n].items() if short in _RECORD_FIELD})
            self._put(moved)
            u.remove(_attempt_attr(n))
        now = int(time.time())
        settled = []
        for name, av in found.items():
            if not _JOURNAL_ATTR.fullmatch(name) or name == journal or av["M"]["s"]["S"] == JournalStatus.pending.value:
                continue
            if int(av["M"]["x"]["N"]) < now:
                u.remove(name)
            else:
                settled.append((av["M"]["c"]["S"], name, av["M"]))
        moving = sorted(settled)[: max(0, len(settled) - (JOURNAL_ON_STEP - (journal is not None)))]
        for _, name, m in moving:
            moved = {
                "pk": pk, "sk": {"S": "J#" + name[1:]}, "index": {"N": str(index)}, "status": m["s"], "created_at": m["c"],
                "expires_at": m["x"],
            }
            if "n" in m:
                moved["attempt"] = m["n"]
            self._put(moved)
            u.remove(name)
        if moving:
            u.add("jm", len(moving))

    @_operation
    def get_attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        item = self._get(_key(tenant, run_id, _step_sk(index)))
        if item is None:
            raise NotFound(f"no attempt {n} of step {index} in run {run_id!r}")
        return self._attempt_at(tenant, run_id, index, n, item)

    @_operation
    def list_attempts(self, tenant: str, run_id: str, index: int | None = None) -> list[Attempt]:
        pk = _pk(tenant, run_id)
        if index is None:
            steps = self._query_range(pk, "S#", STEPS_END)
        else:
            item = self._get(_key(tenant, run_id, _step_sk(index)))
            steps = [item] if item is not None else []
        if not steps:
            self._require_run(tenant, run_id)
            return []
        found: dict[tuple[int, int], Attempt] = {}
        # Attempts moved off their step (only a step that does not keep all of its numbers has any)
        if any(len(self._records(i)) < _number(i["last_n"]["N"]) for i in steps if "last_n" in i):
            for moved in self._query_prefix(pk, "A#" if index is None else f"A#{index:08d}#"):
                attempt = self._attempt_of(moved)
                found[(attempt.index, attempt.n)] = attempt
        for item in steps:
            for attempt in self._attempts_on(item):
                found[(attempt.index, attempt.n)] = attempt
        return [found[k] for k in sorted(found)]

    @_operation
    def end_attempt(
        self,
        ref: AttemptRef,
        status: AttemptStatus,
        *,
        reason: str | None = None,
        step: dict[str, Any] | None = None,
        run_cost: float = 0.0,
        calls: list[ModelCall] | None = None,
        reason_kind: FailureKind | None = None,
    ) -> None:
        status = AttemptStatus(status)
        if status is AttemptStatus.running:
            raise ValueError("an attempt cannot be ended as running")
        kind = None if reason_kind is None else FailureKind(reason_kind).value
        values = _validated(Step, STEP_FIELDS, step or {})
        sk = _step_sk(ref.index)
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            changes = blobs.attrs(sk, {f: _to_attr(f, v) for f, v in values.items()})
            why = blobs.attrs(sk, {"why": reason})["why"]

            def build(u: _Update, condition: list[str], found: dict[str, Any] | None) -> int:
                record = _attempt_attr(ref.n)
                u.set((record, "st"), status.value).set((record, "e"), utcnow())
                if why is not None:
                    u.set((record, "why"), why)
                if kind is not None:
                    u.set((record, "k"), kind)
                u.remove("live_n")
                for field, value in changes.items():
                    u.set(field, value)
                # The step leaves the live index with its attempt, unless a journal entry is pending.
                if found is None or _pending_journal(found) < 1:
                    u.remove("vpk").remove("vsk").remove("jp")
                    condition.append(f"({u.absent('jp')} OR {u.n('jp')} < {u.v(1)})")
                    return 1
                condition.append(f"{u.n('jp')} >= {u.v(1)}")
                return 0

            self._attempt_write(ref, blobs, build, calls=calls, run_cost=run_cost)

    def _attempt_write(
        self,
        ref: AttemptRef,
        blobs: "_Blobs",
        build: Callable[[_Update, list[str], dict[str, Any] | None], int],
        *,
        calls: list[ModelCall] | None = None,
        run_cost: float = 0.0,
    ) -> None:
        """One fenced write to `ref`'s step item. `build` adds the write's changes and
        conditions for the item as a refused try found it (None at first: the cheap form) and
        returns the index entries it writes. Spans go into the step item while it has room,
        else to items of their own; those, or a run cost, make it a transaction. A refusal
        that found the attempt gone is `AttemptEnded`; one that found it running is tried
        again in the form the item calls for."""
        key = _key(ref.tenant, ref.run_id, _step_sk(ref.index))
        spans = self._span_bodies(blobs, ref, calls or [])
        found: dict[str, Any] | None = None
        for _ in range(10):
            u = _Update()
            condition = [_fence(u, ref)]
            indexes = build(u, condition, found)
            puts = self._place_spans(ref, u, condition, spans, found)
            size = _item_size(found) if found is not None else 0
            try:
                if not puts and not run_cost:
                    self._update(key, u, " AND ".join(condition), returns="ALL_NEW", indexes=indexes, blobs=blobs, size=size)
                else:
                    self._fenced_transact(ref, key, u, " AND ".join(condition), puts, run_cost, indexes, blobs, size)
                return
            except _Refused as refused:
                if not refused.failed(0):
                    raise RunNotFound(ref.run_id) from None  # the run item (a cost) is gone
                found = refused.found(0) or self._get(key)
                if not _fence_holds(found, ref):
                    raise _attempt_ended(ref, found) from None
        raise Conflict(f"step {ref.index} of run {ref.run_id!r} kept changing while attempt {ref.n} wrote to it; try again")

    def _fenced_transact(
        self,
        ref: AttemptRef,
        key: dict[str, Any],
        u: _Update,
        condition: str,
        puts: list[dict[str, Any]],
        run_cost: float,
        indexes: int,
        blobs: "_Blobs",
        size: int,
    ) -> None:
        """The step item's fenced update (or a ConditionCheck, when it changes nothing), a run
        cost and span items, in one transaction. Spans past what one transaction holds (an
        attempt of hundreds of turns) are put first, each batch fenced on its own."""
        step = self._tx_update(key, u, condition, size=size + u.payload() if size else None) if u else self._tx_check(key, u, condition)
        actions = [step]
        if run_cost:
            cost = _Update().add("cost_usd", _cost(run_cost))
            actions.append(self._tx_update(_key(ref.tenant, ref.run_id, RUN_SK), cost, cost.exists("pk")))
        batches: list[list[dict[str, Any]]] = [[]]
        for item in reversed(puts):  # the last batch goes with the write itself
            limit = TRANSACTION_ITEMS - (len(actions) if len(batches) == 1 else 1)
            if len(batches[-1]) >= limit or sum(map(_item_size, batches[-1])) + _item_size(item) > TRANSACTION_BYTES // 2:
                batches.append([])
            batches[-1].append(item)
        for batch in reversed(batches[1:]):
            e = _Expr()
            self._transact([self._tx_check(key, e, _fence(e, ref))] + [self._tx_put(i) for i in batch])
        self._transact(actions + [self._tx_put(i) for i in batches[0]], indexes=indexes, squeeze=(blobs, [(key["sk"]["S"], u)]))

    def _span_bodies(self, blobs: "_Blobs", ref: AttemptRef, calls: list[ModelCall]) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """Spans by id (a later one of the same id wins): the body, and the item of one too
        large to keep in the step item."""
        spans: dict[str, tuple[str, dict[str, Any] | None]] = {}
        for call in calls:
            body = call.model_dump_json()
            item = None
            if len(body.encode()) > CALL_INLINE_MAX:
                span = {"pk": _pk(ref.tenant, ref.run_id), "sk": _call_sk(ref.index, call.id), "n": call.n, "body": body}
                item = _encode(blobs.item(span))
            spans[call.id] = (body, item)
        return spans

    def _place_spans(
        self,
        ref: AttemptRef,
        u: _Update,
        condition: list[str],
        spans: dict[str, tuple[str, dict[str, Any] | None]],
        found: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """Put spans into the step item's `calls` map where they fit; return the items the
        others need. Without `found`, the cheap form: every small span into the map,
        conditional on its room. With it: replace those the map holds, add while it has
        room, the rest to items (removed from the map: the map wins over an item)."""
        if not spans:
            return []
        small = [i for i, (_, item) in spans.items() if item is None]
        large = [i for i, (_, item) in spans.items() if item is not None]
        if found is None:
            if small:
                condition.append(f"({u.exists('calls')} AND size({u.n('calls')}) <= {u.v(CALLS_ON_STEP - len(small))})")
            for i in small:
                u.set(("calls", i), spans[i][0])
            condition += [u.absent(("calls", i)) for i in large]  # else the map's older version would win
            return [spans[i][1] for i in large]  # type: ignore[misc]
        held = found.get("calls", {}).get("M")
        room = CALLS_ON_STEP - len(held or {})
        inline, out = [], list(large)
        for i in small:
            if held is not None and i in held:
                inline.append(i)
            elif room > 0:
                inline.append(i)
                room -= 1
            else:
                out.append(i)
        if held is None:
            condition.append(u.absent("calls"))
            if inline:
                u.set("calls", {i: spans[i][0] for i in inline})
        else:
            condition.append(f"({u.exists('calls')} AND size({u.n('calls')}) = {u.v(len(held))})")
            for i in inline:
                u.set(("calls", i), spans[i][0])
            for i in out:
                if i in held:
                    u.remove(("calls", i))
        overflow = [i for i in out if spans[i][1] is None]
        stored = self._stored_spans(ref) if overflow else {}
        items = []
        for i in out:
            body, item = spans[i]
            if item is None:
                if stored.get(i) == body:
                    continue  # kept as it is already (the spans an attempt wrote as it went, written again with its end)
                item = _encode({"pk": _pk(ref.tenant, ref.run_id), "sk": _call_sk(ref.index, i), "n": json.loads(body)["n"], "body": body})
            items.append(item)
        return items

    def _stored_spans(self, ref: AttemptRef) -> dict[str, str]:
        """The bodies of a step's span items, by id (those kept in S3 left out)."""
        prefix = _call_sk(ref.index, "")
        items = self._query_prefix(_pk(ref.tenant, ref.run_id), prefix)
        return {i["sk"]["S"][len(prefix) :]: i["body"]["S"] for i in items if "S" in i["body"]}

    @_operation
    def set_attempt_worker(self, ref: AttemptRef, worker: str) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            kept = blobs.attrs(_step_sk(ref.index), {"w": worker})["w"]
            self._attempt_write(ref, blobs, _setting((_attempt_attr(ref.n), "w"), kept))

    @_operation
    def heartbeat(self, ref: AttemptRef, at: str) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            self._attempt_write(ref, blobs, _setting((_attempt_attr(ref.n), "hb"), at))

    @_operation
    def running_attempts(self, tenant: str | None = None) -> list[tuple[str, Attempt]]:
        found = []
        for item in self._live("STEP", tenant):
            if "live_n" not in item:
                continue
            n = _number(item["live_n"]["N"])
            record = _record_of(item, n)  # type: ignore[arg-type]
            if record is None or record.get("st", {}).get("S") != AttemptStatus.running.value:
                continue
            owner, run_id = _tenant_run(item["pk"]["S"])
            found.append((owner, self._record_attempt(run_id, _number(item["index"]["N"]), n, record)))  # type: ignore[arg-type]
        return sorted(found, key=lambda ta: (ta[0], ta[1].run_id, ta[1].index, ta[1].n))

    def _live(self, kind: str, tenant: str | None) -> list[dict[str, Any]]:
        """The items the sparse `live` index names for `kind`, re-read consistently (the
        index lags the table a little): Query for one tenant, Scan of the index for all."""
        if tenant is not None:
            e = _Expr()
            keys = self._query(
                index=LIVE_INDEX, KeyConditionExpression=f"{e.n('vpk')} = {e.v(_live_pk(tenant, kind))}", **e.params()
            )
        else:
            e = _Expr()
            kind_only = f"begins_with({e.n('sk')}, {e.v(_LIVE_KINDS[kind])})"
            params: dict[str, Any] = {"IndexName": LIVE_INDEX, "FilterExpression": kind_only, **e.params()}
            keys = []
            while True:
                page = self._request("scan", **params)
                keys += page.get("Items", [])
                self._count(read=0.5 * _read_units(sum(_item_size(i) for i in page.get("Items", []))))
                if "LastEvaluatedKey" not in page:
                    break
                params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        items = self._batch_get([{"pk": k["pk"], "sk": k["sk"]} for k in keys])
        return [i for i in items if "vpk" in i]

    # -- the claim journal --------------------------------------------------------------

    @_operation
    def journal_begin(self, tenant: str, run_id: str, op_id: str, index: int, *, ttl_s: int = 7 * 24 * 3600) -> JournalEntry:
        entry = JournalEntry(
            tenant=tenant, run_id=run_id, op_id=op_id, index=index, created_at=utcnow(), expires_at=int(time.time()) + ttl_s
        )
        journal = _journal_attr(op_id)
        moved: int | None = None  # how many entries the step had moved off when last read
        for _ in range(10):
            u = _Update().set(journal, {"s": entry.status.value, "op": op_id, "c": entry.created_at, "x": entry.expires_at})
            u.add("jp", 1).set("vpk", _live_pk(tenant, "STEP")).set("vsk", _live_sk(run_id, index))
            condition = " AND ".join([u.exists("pk"), u.absent(journal), u.eq("jm", moved)])
            try:
                # The step enters the live index unless it is there already (an attempt runs, or
                # another entry is pending): setting the same key writes no index entry.
                self._update(
                    _key(tenant, run_id, _step_sk(index)), u, condition, returns="ALL_NEW",
                    indexes=lambda new: int("live_n" not in new and _pending_journal(new) == 1),
                )
                return entry
            except _Refused as refused:
                found = refused.found(0) or self._get(_key(tenant, run_id, _step_sk(index)))
            if found is None:
                self._require_run(tenant, run_id)
                raise NotFound(f"no step {index} in run {run_id!r}")
            existing = self._entry_on(tenant, run_id, op_id, found)
            if existing is None and "jm" in found:
                existing = self._moved_entry(tenant, run_id, op_id)
                moved = _number(found["jm"]["N"])  # type: ignore[assignment]
            if existing is not None:
                return existing
        raise Conflict(f"step {index} of run {run_id!r} kept changing while {op_id!r} was journaled; try again")

    @_operation
    def journal_get(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        item = self._journal_step(tenant, run_id, op_id)
        if item is not None:
            return self._entry_on(tenant, run_id, op_id, item)
        return self._moved_entry(tenant, run_id, op_id)

    @_operation
    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        entries = []
        for item in self._live("STEP", tenant):
            owner, run_id = _tenant_run(item["pk"]["S"])
            for name, av in item.items():
                if _JOURNAL_ATTR.fullmatch(name) and av["M"]["s"]["S"] == JournalStatus.pending.value:
                    entries.append(self._entry_on(owner, run_id, av["M"]["op"]["S"], item))
        return sorted((e for e in entries if e is not None), key=lambda e: e.created_at)

    @_operation
    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        journal = _journal_attr(op_id)
        item = self._journal_step(tenant, run_id, op_id)
        for _ in range(10):
            if item is None:
                moved = self._moved_entry(tenant, run_id, op_id)
                if moved is None:
                    raise NotFound(f"no journal entry {op_id!r} in run {run_id!r}")
                return moved
            entry = self._entry_on(tenant, run_id, op_id, item)
            assert entry is not None
            if entry.status != JournalStatus.pending:
                return entry
            key = {"pk": item["pk"], "sk": item["sk"]}
            landed = [n for n, record in sorted(self._records(item).items()) if record.get("op", {}).get("S") == op_id]
            settled = {"s": JournalStatus.cancelled.value, "c": entry.created_at, "x": entry.expires_at}
            if landed:
                settled.update(s=JournalStatus.completed.value, n=landed[0])
            u = _Update().set(journal, settled).add("jp", -1)
            live = "live_n" in item
            condition = [u.eq((journal, "s"), JournalStatus.pending.value), u.eq("jp", _pending_journal(item))]
            condition.append(u.exists("live_n") if live else u.absent("live_n"))
            leaves = not live and _pending_journal(item) <= 1  # the last live thing of the step
            if leaves:
                u.remove("vpk").remove("vsk")
            try:
                new = self._update(key, u, " AND ".join(condition), returns="ALL_NEW", size=_item_size(item), indexes=int(leaves))
                return self._entry_on(tenant, run_id, op_id, new)  # type: ignore[arg-type,return-value]
            except _Refused as refused:  # claimed, settled or joined meanwhile: look again
                item = refused.found(0) or self._get(key)
        raise Conflict(f"the journal entry {op_id!r} of run {run_id!r} kept changing while it was settled; try again")

    # -- active runs ----------------------------------------------------------------------------

    @_operation
    def active_runs(self, tenant: str | None = None) -> list[Run]:
        heads = [i for i in self._live("RUN", tenant) if i.get("status", {}).get("S") in _ACTIVE_RUN and "hidden" not in i]
        heads.sort(key=lambda i: i["vsk"]["S"])
        return self._runs([i["pk"]["S"] for i in heads])

    # -- trace ------------------------------------------------------------------------------

    @_operation
    def add_event(
        self, tenant: str, run_id: str, index: int, event: Event, *, attempt: AttemptRef | None = None
    ) -> None:
        if attempt is not None and (attempt.tenant, attempt.run_id, attempt.index) != (tenant, run_id, index):
            raise ValueError(
                f"the attempt named (run {attempt.run_id!r}, step {attempt.index}) is not of run {run_id!r}, step {index}"
            )
        attrs = self._event_attrs(event, event.attempt if attempt is None else attempt.n)
        with self._blobs(tenant, run_id) as blobs:
            item = blobs.item({"pk": _pk(tenant, run_id), "sk": _event_sk(index, _SEQUENCE.next()), **attrs})
            if attempt is None:
                self._require_step(tenant, run_id, index)  # steps are never deleted: a read is enough
                self._put(_encode(item))
            else:
                self._fenced_put(attempt, _encode(item))

    def _fenced_put(self, ref: AttemptRef, item: dict[str, Any]) -> None:
        """Put an item only while `ref` is the stored, running attempt: one transaction of a
        ConditionCheck on the step item and the put."""
        e = _Expr()
        check = self._tx_check(_key(ref.tenant, ref.run_id, _step_sk(ref.index)), e, _fence(e, ref))
        try:
            self._transact([check, self._tx_put(item)])
        except _Refused as refused:
            raise _attempt_ended(ref, refused.found(0)) from None

    @_operation
    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            self._attempt_write(ref, blobs, _no_changes, calls=[call])

    @_operation
    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            kept = blobs.attrs(_step_sk(ref.index), {"layers": _layers_json(layers)})["layers"]
            self._attempt_write(ref, blobs, _setting("layers", kept))

    # -- handoffs ----------------------------------------------------------------------------

    @_operation
    def put_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        self._require_run(tenant, run_id)  # runs are never deleted: a read is enough
        with self._blobs(tenant, run_id) as blobs:
            self._put(_encode(blobs.item({"pk": _pk(tenant, run_id), "sk": f"H#{key}", "text": text})))

    @_operation
    def get_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        item = self._get(_key(tenant, run_id, f"H#{key}"))
        return None if item is None else self._text(item["text"])

    # -- the warm gate -------------------------------------------------------------------------

    @_operation
    def gate_wait(self, tenant: str, run_id: str, key: str, token: str) -> bool:
        # The rendezvous without a transaction. Each waiting token is an item of its own (a
        # lane may have hundreds of siblings, and a callback token is ~1 KB). A sibling keeps
        # its token, then looks at the gate (strongly consistent reads throughout); the lead
        # marks the gate open, then takes the tokens kept. A token is handed back by whoever
        # deletes it (a conditional delete), so exactly once: a sibling that finds the gate
        # opened after it kept its token takes it back itself unless the lead already did.
        gate_key = _key(tenant, run_id, f"G#{key}")
        gate = self._get(gate_key)
        if gate is not None and "opened_at" in gate:
            return True  # the lead's reply has begun: nothing to keep
        item = _encode({"pk": _pk(tenant, run_id), "sk": _gate_token_prefix(key) + _digest(token), "token": token})
        self._put(item)
        gate = self._get(gate_key)
        if gate is None or "opened_at" not in gate:
            return False  # kept: the lead will complete it
        e = _Expr()
        try:
            self._request("delete_item", Key={"pk": item["pk"], "sk": item["sk"]}, ConditionExpression=e.exists("pk"), **e.params())
        except _Refused:
            return False  # the lead took it first: the lead completes it
        self._count(write=_write_units(_item_size(item)))
        return True

    @_operation
    def gate_open(self, tenant: str, run_id: str, key: str) -> list[str]:
        u = _Update().set_default("opened_at", utcnow())
        self._update(_key(tenant, run_id, f"G#{key}"), u)
        # Every token put before the gate opened is now visible; each is handed back by
        # whoever deletes it (a second opener racing this one gets the others, never the same).
        handed = []
        for item in self._query_prefix(_pk(tenant, run_id), _gate_token_prefix(key)):
            e = _Expr()
            key = {"pk": item["pk"], "sk": item["sk"]}
            try:
                reply = self._request("delete_item", Key=key, ConditionExpression=e.exists("pk"), ReturnValues="ALL_OLD", **e.params())
            except _Refused:
                continue
            self._count(write=_write_units(_item_size(item)))
            if "Attributes" in reply:
                handed.append(reply["Attributes"]["token"]["S"])
        return handed



class _Blobs:
    """One write's large values: over the threshold (or to keep an item under ~350 KB) they
    go to S3 under a key of their own; `undo` deletes what a failed write uploaded."""

    def __init__(self, store: DynamoStore, tenant: str, run_id: str) -> None:
        self.store = store
        self.prefix = f"{tenant}/{run_id}/"
        self.uploaded: list[str] = []

    def item(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """A whole item (plain values, `sk` included) with its large values moved out."""
        return {**attrs, **self.attrs(attrs["sk"], {k: v for k, v in attrs.items() if k not in ("pk", "sk")})}

    def attrs(self, sk: str, attrs: dict[str, Any]) -> dict[str, Any]:
        """Plain attribute values of one item, its large ones replaced by S3 pointers."""
        sizes = {k: len(v.encode()) for k, v in attrs.items() if k in _BLOBBABLE and isinstance(v, str)}
        total = sum(len(k) + (sizes.get(k) or _av_size(_av(v))) for k, v in attrs.items() if v is not None)
        moving = [k for k, size in sizes.items() if size > self.store.blob_threshold]
        if self.store.bucket is None:
            if total > ITEM_LIMIT:
                largest = max(sizes, key=sizes.__getitem__) if sizes else "?"
                raise _too_large(f"{largest} of {sk} is {sizes.get(largest, total):,} bytes, and the item {total:,}", None)
            return attrs
        remaining = total - sum(sizes[k] for k in moving)
        for k in sorted(sizes, key=sizes.__getitem__, reverse=True):
            if remaining <= ITEM_LIMIT:
                break
            if k not in moving:
                moving.append(k)
                remaining -= sizes[k]
        out = dict(attrs)
        for k in moving:
            out[k] = {"s3": self._upload(sk, k, attrs[k])}
        return out

    def squeeze(self, sk: str, u: _Update) -> bool:
        """Move every value over 1 KB that `u` sets to S3 (the item it updates would pass
        400 KB with what it already holds). False if there is nowhere to move them, or none."""
        if self.store.bucket is None:
            return False
        moved = False
        for alias, name in u.assigned.items():
            value = u.values[alias]
            if name in _BLOBBABLE and "S" in value and len(value["S"].encode()) > 1024:
                u.values[alias] = _av({"s3": self._upload(sk, name, value["S"])})
                moved = True
        return moved

    def _upload(self, sk: str, attr: str, text: str) -> str:
        key = f"{self.prefix}{sk.replace('#', '/')}/{attr}-{uuid.uuid4().hex}"
        self.store._s3.put_object(
            Bucket=self.store.bucket, Key=key, Body=text.encode("utf-8"), ContentType="text/plain; charset=utf-8"
        )
        self.uploaded.append(key)
        return f"s3://{self.store.bucket}/{key}"

    def undo(self) -> None:
        for key in self.uploaded:
            try:
                self.store._s3.delete_object(Bucket=self.store.bucket, Key=key)
            except ClientError:  # pragma: no cover - best effort: an orphan blob harms nothing
                pass



def _encode(attrs: dict[str, Any]) -> dict[str, Any]:
    """An item of plain values as DynamoDB AttributeValues (None values left out)."""
    return {k: _av(v) for k, v in attrs.items() if v is not None}



def _layers_json(layers: list[PromptLayer]) -> str:
    return _dumps([layer.model_dump() for layer in layers])
