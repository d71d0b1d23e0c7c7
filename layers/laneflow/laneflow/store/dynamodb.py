"""The DynamoDB store: one table, and an S3 bucket for values too large for an item.

Items (one table; `pk` is always tenant-first, `idx` is a step index zero-padded to 8
digits, `n` an attempt number padded to 6, so keys sort in index order):

| item            | pk                 | sk                         | holds                                   |
|-----------------|--------------------|----------------------------|-----------------------------------------|
| run             | T#<tenant>#R#<run> | RUN                        | every Run field but input and flow_spec |
| run input       | T#<tenant>#R#<run> | RUN#INPUT                  | input, flow_spec (JSON; never change)   |
| step            | T#<tenant>#R#<run> | S#<idx>                    | the Step's fields; live_n, last_n       |
| attempt         | T#<tenant>#R#<run> | A#<idx>#<n>                | the Attempt's fields; layers            |
| event           | T#<tenant>#R#<run> | T#<idx>#E#<time ns><rand>  | t, type, text, attempt, data            |
| model-call span | T#<tenant>#R#<run> | T#<idx>#C#<call id>        | n, body (the ModelCall as JSON)         |
| prompt layers   | T#<tenant>#R#<run> | T#<idx>#L                  | layers a record was created with        |
| journal entry   | T#<tenant>#R#<run> | J#<op_id>                  | the JournalEntry; expires_at is the TTL |
| handoff         | T#<tenant>#R#<run> | H#<key>                    | text                                    |
| gate            | T#<tenant>#R#<run> | G#<key>                    | opened_at                               |
| gate token      | T#<tenant>#R#<run> | GT#<sha(key)>#<sha(token)> | token (one item per waiting sibling)    |

Everything of a run is one partition. Everything at or after `RUN` is what `get_run`
shows, so a run reads in one Query: `RUN`..`S#~` is the run and its steps (no trace),
`RUN`..end adds the trace. Events and spans are items of their own, never a growing list.

Indexes (both in template.yaml's RunsTable, which the contract test builds the table from):
- `by-tenant` (lpk = `T#<tenant>#RUNS`, lsk = `<created_at>#<seq>`, projects `status`): every
  run, for `list_runs` newest first.
- `live` (vpk, vsk; keys only) is sparse: `vpk` is set only while a run is queued, running
  or awaiting approval (`T#<tenant>#LIVE#RUN`), an attempt is running (`...#LIVE#ATTEMPT`),
  or a journal entry is pending (`...#LIVE#JOURNAL`), and removed by the write that ends
  it. `active_runs`, `running_attempts` and `journal_pending` Query it for one tenant;
  for all tenants (reconcile) they Scan it - it holds only what is live, so the cost
  grows with live things, never with the table. Keeping every index key tenant-first means
  a tenant-scoped IAM policy (`dynamodb:LeadingKeys`) covers the indexes too.

Writes. Every conditional write is a ConditionExpression; where one item cannot carry the
condition, a TransactWriteItems: `claim_attempt` (step + attempt + journal entry),
`end_attempt` (attempt + step + run cost), fenced events and spans (a ConditionCheck on the
attempt + the new item), `create_run`, `add_steps`, `gate_wait`. A refused write raises the
domain error (`Conflict`, `AttemptEnded`, `RunNotFound`, `NotFound`) and changed nothing.
A write about an attempt is conditional on the attempt item's exact identity (token,
started_at, resumed_at - attribute_not_exists when None) and `status = running`. Writes
that fit one item stay single conditional updates (1 WCU for a small item, where a
transaction costs 2 per item): worker, heartbeat, prompt layers - which is why an
attempt's prompt layers live on its own item (the step shows those of its latest attempt
that set any, else those it was created with). Costs are added with ADD, exactly, as
decimals rounded to 6 places. `last_n` on the step keeps attempt numbers from ever
repeating; `live_n` says which attempt runs (a claim needs it absent).

Large values. A text or JSON attribute (input, flow_spec, instruction, result, conclusion,
data, item, error, reason, event text and data, span body, handoff text, layers...) over
`blob_threshold` (64 KB) goes to `s3://<bucket>/<tenant>/<run_id>/<sk>/<attr>-<uuid>` and
the item keeps `{"s3": "s3://..."}`; reads resolve it. A blob's key is new on every write,
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
index entry written or removed 1 WCU). An update is counted on the size of what it
writes, or of the item after it when the store knows it (DynamoDB bills the larger of the
item before and after, which the store does not read): a lower bound for updates of large
items. moto reports no real capacity, so the count is the store's own.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
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

from ..errors import AttemptEnded, Conflict, InvalidInput, NotFound, RunNotFound
from ..models import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
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
from .base import RUN_FIELDS, STEP_FIELDS, Store

# Store-neutral helpers the SQLite store defines (the same messages and validation on both).
from .sqlite import COST_DECIMALS, _dumps, _field_adapter, _refuse_status, _statuses

BLOB_THRESHOLD = 64 * 1024
ITEM_LIMIT = 350 * 1024  # a margin under DynamoDB's 400 KB per item
TRANSACTION_ITEMS = 100
TRANSACTION_BYTES = 4 * 1024 * 1024 - 64 * 1024
BY_TENANT_INDEX = "by-tenant"
LIVE_INDEX = "live"

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
_JOURNAL_FIELDS = tuple(JournalEntry.model_fields)
# Attributes that may move to S3 (never keys, identities or statuses: conditions read those).
_BLOBBABLE = frozenset(
    {
        "input", "flow_spec", "options", "item", "data", "instruction", "result", "conclusion",
        "error", "skip_reason", "reason", "worker", "layers", "text", "body",
    }
)


class ItemTooLarge(InvalidInput):
    """A value too large to keep in a DynamoDB item, and no blob bucket to put it in."""


# -- values --------------------------------------------------------------------------------


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


def _pk(tenant: str, run_id: str) -> str:
    if not tenant or "#" in tenant:
        raise ValueError(f"a tenant name cannot be empty or contain '#': {tenant!r}")
    return f"T#{tenant}#R#{run_id}"


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


def _layers_sk(index: int) -> str:
    return f"{_trace_prefix(index)}L"


def _journal_sk(op_id: str) -> str:
    return f"J#{op_id}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _gate_token_prefix(key: str) -> str:
    return f"GT#{_digest(key)}#"


def _runs_pk(tenant: str) -> str:
    return f"T#{tenant}#RUNS"


def _live_pk(tenant: str, kind: str) -> str:
    return f"T#{tenant}#LIVE#{kind}"


_LIVE_KINDS = {"RUN": RUN_SK, "ATTEMPT": "A#", "JOURNAL": "J#"}  # kind -> the sk its items start with


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


class _Expr:
    """The names and values of one request's expressions. Every name is aliased: many of
    ours (status, index, group, data, token, text) are DynamoDB reserved words."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, dict[str, Any]] = {}

    def n(self, name: str) -> str:
        alias = f"#{name}"
        self.names[alias] = name
        return alias

    def v(self, value: Any) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = _av(value)
        return alias

    def exists(self, name: str) -> str:
        return f"attribute_exists({self.n(name)})"

    def absent(self, name: str) -> str:
        return f"attribute_not_exists({self.n(name)})"

    def eq(self, name: str, value: Any) -> str:
        return self.absent(name) if value is None else f"{self.n(name)} = {self.v(value)}"

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

    def set(self, name: str, value: Any) -> "_Update":
        if value is None:
            return self.remove(name)
        alias = self.v(value)
        self.assigned[alias] = name
        self._set.append(f"{self.n(name)} = {alias}")
        return self

    def set_default(self, name: str, value: Any) -> "_Update":
        alias = self.n(name)
        self._set.append(f"{alias} = if_not_exists({alias}, {self.v(value)})")
        return self

    def add(self, name: str, value: Any) -> "_Update":
        self._add.append(f"{self.n(name)} {self.v(value)}")
        return self

    def remove(self, name: str) -> "_Update":
        self._remove.append(self.n(name))
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
    """The condition that the stored attempt is exactly `ref`'s and still running."""
    return " AND ".join(
        [
            e.eq("token", ref.token),
            e.eq("started_at", ref.started_at),
            e.eq("resumed_at", ref.resumed_at),
            e.eq("status", AttemptStatus.running.value),
        ]
    )


def _attempt_ended(ref: AttemptRef, found: dict[str, Any] | None) -> AttemptEnded:
    what = f"attempt {ref.n} of step {ref.index} of run {ref.run_id!r}"
    if found is None:
        return AttemptEnded(f"{what} does not exist")
    status = found.get("status", {}).get("S", "?")
    same = (
        found.get("token", {}).get("S") == ref.token
        and found.get("started_at", {}).get("S") == ref.started_at
        and found.get("resumed_at", {}).get("S") == ref.resumed_at
    )
    if not same:
        return AttemptEnded(f"{what} is not the attempt named (its token or times differ); it is {status}")
    return AttemptEnded(f"{what} has ended ({status})")


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
        indexes: int = 0,
        blobs: "_Blobs | None" = None,
    ) -> dict[str, Any] | None:
        """One UpdateItem. If the item would pass 400 KB with what it already holds (the
        store sees only what it writes) and `blobs` can take them, the write's large values go
        to S3 and it is made once more."""
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
        size = _item_size(item) if item and returns == "ALL_NEW" else _item_size(key) + u.payload()
        self._count(write=_write_units(size) + indexes)
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
        """The named model fields of an item (absent ones left to the model's defaults)."""
        out: dict[str, Any] = {}
        for name in names:
            if name in item:
                value = self._text(item[name])
                out[name] = json.loads(value) if name in _JSON else value
        return out

    # -- items ----------------------------------------------------------------------------

    @staticmethod
    def _attrs(model: Any, fields: Iterable[str]) -> dict[str, Any]:
        return {f: v for f in fields if (v := _to_attr(f, getattr(model, f))) is not None}

    def _step_items(self, blobs: "_Blobs", tenant: str, run_id: str, step: Step) -> list[dict[str, Any]]:
        """A step record with whatever events, calls and layers it carries."""
        pk = {"pk": _pk(tenant, run_id)}
        items = [blobs.item({**pk, "sk": _step_sk(step.index), **self._attrs(step, _STEP_FIELDS)})]
        for event in step.events:
            items.append(blobs.item({**pk, "sk": _event_sk(step.index, _SEQUENCE.next()), **self._event_attrs(event, event.attempt)}))
        for call in step.calls:
            items.append(blobs.item({**pk, "sk": _call_sk(step.index, call.id), "n": call.n, "body": call.model_dump_json()}))
        if step.prompt_layers:
            items.append(blobs.item({**pk, "sk": _layers_sk(step.index), "layers": _layers_json(step.prompt_layers)}))
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
        return Run.model_validate({**fields, "steps": steps or []})

    def _step_of(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._fields(item, _STEP_FIELDS)

    def _attempt_of(self, item: dict[str, Any]) -> Attempt:
        return Attempt.model_validate(self._fields(item, _ATTEMPT_FIELDS))

    def _entry_of(self, item: dict[str, Any]) -> JournalEntry:
        return JournalEntry.model_validate(self._fields(item, _JOURNAL_FIELDS))

    def _with_trace(self, steps: dict[int, dict[str, Any]], trace: list[dict[str, Any]], attempts: list[dict[str, Any]]) -> None:
        """Attach events (in key order: the order written), calls (by n) and prompt layers
        (the latest attempt's that set any, else the record's own) to step dicts."""
        for step in steps.values():
            step.update(events=[], calls=[], prompt_layers=[])
        for item in trace:
            sk = item["sk"]["S"]
            index, kind = int(sk[2:10]), sk[11]
            step = steps.get(index)
            if step is None:
                continue
            if kind == "E":
                step["events"].append(self._fields(item, ("t", "type", "text", "attempt", "data")))
            elif kind == "C":
                step["calls"].append(json.loads(self._text(item["body"])))
            elif kind == "L":
                step["prompt_layers"] = json.loads(self._text(item["layers"]))
        for item in attempts:  # ordered by (index, n): a later attempt's layers win
            step = steps.get(_number(item["index"]["N"]))
            if step is not None and "layers" in item:
                step["prompt_layers"] = json.loads(self._text(item["layers"]))
        for step in steps.values():
            step["calls"].sort(key=lambda c: (c.get("n", 1), c["id"]))

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
            elif sk.startswith("T#"):
                trace.append(item)
        if head is None or "hidden" in head:
            raise RunNotFound(run_id)
        if detail and steps:
            self._with_trace(step_items, trace, self._query_prefix(pk, "A#"))
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
                out.append(self._run_of(head, found.get((pk, INPUT_SK))))
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
        return [Step.model_validate(self._step_of(i)) for i in items]

    @_operation
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        step = self._step_of(self._require_step(tenant, run_id, index))
        if detail:
            pk = _pk(tenant, run_id)
            steps = {index: step}
            self._with_trace(steps, self._query_prefix(pk, _trace_prefix(index)), self._query_prefix(pk, f"A#{index:08d}#"))
        return Step.model_validate(step)

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
    ) -> Attempt:
        expected = _statuses(expect_status)
        what = f"step {index} of run {run_id!r}"
        for _ in range(20):  # another writer changed the step between our read and our write
            entry = None
            if op_id is not None:
                entry = self._get(_key(tenant, run_id, _journal_sk(op_id)))
                status = entry["status"]["S"] if entry else None
                if status == JournalStatus.completed.value:
                    # A re-delivered invocation: it gets what the first one got, nothing new.
                    got = self._entry_of(entry)  # type: ignore[arg-type]
                    return self.get_attempt(tenant, run_id, got.index, got.attempt or 0)
                if status == JournalStatus.cancelled.value:
                    raise Conflict(f"operation {op_id!r} was cancelled: its claim never landed")
            found = self._require_step(tenant, run_id, index)
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
            step = _Update().set("status", StepStatus.running.value).set("attempts", n).set("last_n", n).set("live_n", n)
            step.set_default("started_at", started_at)
            step_condition = " AND ".join(
                [step.one_of("status", expected), step.absent("live_n"), step.eq("attempts", attempts), step.eq("last_n", last_n)]
            )
            attempt = {
                "pk": _pk(tenant, run_id),
                "sk": _attempt_sk(index, n),
                "tenant": tenant,
                "run_id": run_id,
                "index": index,
                "n": n,
                "token": token,
                "started_at": started_at,
                "status": AttemptStatus.running.value,
                "vpk": _live_pk(tenant, "ATTEMPT"),
                "vsk": f"{run_id}#{index:08d}#{n:06d}",
            }
            for name, value in (("resumed_at", resumed_at), ("op_id", op_id)):
                if value is not None:
                    attempt[name] = value
            new = _Expr()
            actions = [
                self._tx_update(_key(tenant, run_id, _step_sk(index)), step, step_condition, size=_item_size(found) + step.payload()),
                self._tx_put(_encode(attempt), new.absent("pk"), new),
            ]
            indexes = 1
            if op_id is not None:
                actions.append(self._journal_claimed(tenant, run_id, op_id, index, n, token, started_at, resumed_at, journal_ttl_s))
                indexes += 1 if entry is not None else 0  # a pending entry leaves the live index
            try:
                self._transact(actions, indexes=indexes)
            except _Refused:
                continue  # read again: the refusal's reason is what the step or journal now says
            return Attempt(run_id=run_id, index=index, n=n, token=token, started_at=started_at, resumed_at=resumed_at, op_id=op_id)
        raise Conflict(f"{what} kept changing while it was claimed; try again")

    def _journal_claimed(
        self, tenant: str, run_id: str, op_id: str, index: int, n: int, token: str, started_at: str, resumed_at: str | None, ttl_s: int
    ) -> tuple[dict[str, Any], int]:
        """The journal entry of `op_id` as `completed` with this attempt: made here if
        `journal_begin` did not make it, and only if nothing settled it meanwhile."""
        u = _Update()
        for name, value in (("tenant", tenant), ("run_id", run_id), ("op_id", op_id), ("index", index)):
            u.set(name, value)
        u.set("status", JournalStatus.completed.value).set("attempt", n).set("token", token).set("started_at", started_at)
        u.set("resumed_at", resumed_at)
        u.set_default("created_at", utcnow()).set_default("expires_at", int(time.time()) + ttl_s)
        u.set_default("vsk", f"{utcnow()}#{_SEQUENCE.next()}").remove("vpk")
        condition = f"{u.absent('pk')} OR {u.eq('status', JournalStatus.pending.value)}"
        return self._tx_update(_key(tenant, run_id, _journal_sk(op_id)), u, condition)

    @_operation
    def get_attempt(self, tenant: str, run_id: str, index: int, n: int) -> Attempt:
        item = self._get(_key(tenant, run_id, _attempt_sk(index, n)))
        if item is None:
            raise NotFound(f"no attempt {n} of step {index} in run {run_id!r}")
        return self._attempt_of(item)

    @_operation
    def list_attempts(self, tenant: str, run_id: str, index: int | None = None) -> list[Attempt]:
        items = self._query_prefix(_pk(tenant, run_id), "A#" if index is None else f"A#{index:08d}#")
        if not items:
            self._require_run(tenant, run_id)
        return [self._attempt_of(i) for i in items]

    @_operation
    def end_attempt(
        self,
        ref: AttemptRef,
        status: AttemptStatus,
        *,
        reason: str | None = None,
        step: dict[str, Any] | None = None,
        run_cost: float = 0.0,
    ) -> None:
        status = AttemptStatus(status)
        if status is AttemptStatus.running:
            raise ValueError("an attempt cannot be ended as running")
        values = _validated(Step, STEP_FIELDS, step or {})
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            attempt = _Update().set("status", status.value).set("ended_at", utcnow()).remove("vpk")
            attempt.set("reason", blobs.attrs(_attempt_sk(ref.index, ref.n), {"reason": reason})["reason"])
            changes = _Update()
            for field, value in blobs.attrs(_step_sk(ref.index), {f: _to_attr(f, v) for f, v in values.items()}).items():
                changes.set(field, value)
            changes.remove("live_n")
            actions = [
                self._tx_update(_key(ref.tenant, ref.run_id, _attempt_sk(ref.index, ref.n)), attempt, _fence(attempt, ref)),
                self._tx_update(_key(ref.tenant, ref.run_id, _step_sk(ref.index)), changes, changes.exists("pk")),
            ]
            if run_cost:
                cost = _Update().add("cost_usd", _cost(run_cost))
                actions.append(self._tx_update(_key(ref.tenant, ref.run_id, RUN_SK), cost, cost.exists("pk")))
            try:
                squeeze = [(_attempt_sk(ref.index, ref.n), attempt), (_step_sk(ref.index), changes)]
                self._transact(actions, indexes=1, squeeze=(blobs, squeeze))
            except _Refused as refused:
                raise _attempt_ended(ref, refused.found(0)) from None

    def _fenced_update(self, ref: AttemptRef, u: _Update) -> None:
        try:
            self._update(_key(ref.tenant, ref.run_id, _attempt_sk(ref.index, ref.n)), u, _fence(u, ref))
        except _Refused as refused:
            raise _attempt_ended(ref, refused.found(0)) from None

    @_operation
    def set_attempt_worker(self, ref: AttemptRef, worker: str) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            self._fenced_update(ref, _Update().set("worker", blobs.attrs(_attempt_sk(ref.index, ref.n), {"worker": worker})["worker"]))

    @_operation
    def heartbeat(self, ref: AttemptRef, at: str) -> None:
        self._fenced_update(ref, _Update().set("heartbeat_at", at))

    @_operation
    def running_attempts(self, tenant: str | None = None) -> list[tuple[str, Attempt]]:
        items = [i for i in self._live("ATTEMPT", tenant) if i.get("status", {}).get("S") == AttemptStatus.running.value]
        found = [(i["tenant"]["S"], self._attempt_of(i)) for i in items]
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

    # -- the claim journal --------------------------------------------------------------------

    @_operation
    def journal_begin(self, tenant: str, run_id: str, op_id: str, index: int, *, ttl_s: int = 7 * 24 * 3600) -> JournalEntry:
        self._require_run(tenant, run_id)
        created = utcnow()
        entry = JournalEntry(
            tenant=tenant, run_id=run_id, op_id=op_id, index=index, created_at=created, expires_at=int(time.time()) + ttl_s
        )
        item = {
            "pk": _pk(tenant, run_id),
            "sk": _journal_sk(op_id),
            **self._attrs(entry, _JOURNAL_FIELDS),
            "vpk": _live_pk(tenant, "JOURNAL"),
            "vsk": f"{created}#{_SEQUENCE.next()}",
        }
        e = _Expr()
        try:
            self._put(_encode(item), e.absent("pk"), e, indexes=1)
        except _Refused as refused:
            found = refused.found(0) or self._get(_key(tenant, run_id, _journal_sk(op_id)))
            return self._entry_of(found)  # type: ignore[arg-type]
        return entry

    @_operation
    def journal_get(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        item = self._get(_key(tenant, run_id, _journal_sk(op_id)))
        return None if item is None else self._entry_of(item)

    @_operation
    def journal_pending(self, tenant: str | None = None) -> list[JournalEntry]:
        entries = [self._entry_of(i) for i in self._live("JOURNAL", tenant)]
        return sorted((e for e in entries if e.status == JournalStatus.pending), key=lambda e: e.created_at)

    @_operation
    def journal_settle(self, tenant: str, run_id: str, op_id: str) -> JournalEntry:
        key = _key(tenant, run_id, _journal_sk(op_id))
        item = self._get(key)
        if item is None:
            raise NotFound(f"no journal entry {op_id!r} in run {run_id!r}")
        entry = self._entry_of(item)
        if entry.status != JournalStatus.pending:
            return entry
        landed = self._query_prefix(_pk(tenant, run_id), f"A#{entry.index:08d}#", where=lambda e: e.eq("op_id", op_id))
        u = _Update().remove("vpk")
        if landed:
            first = self._attempt_of(landed[0])
            u.set("status", JournalStatus.completed.value).set("attempt", first.n).set("token", first.token)
            u.set("started_at", first.started_at).set("resumed_at", first.resumed_at)
        else:
            u.set("status", JournalStatus.cancelled.value)
        try:
            settled = self._update(key, u, u.eq("status", JournalStatus.pending.value), returns="ALL_NEW", indexes=1)
            return self._entry_of(settled)  # type: ignore[arg-type]
        except _Refused as refused:  # settled (or claimed) meanwhile: it is what it is now
            return self._entry_of(refused.found(0) or self._get(key))  # type: ignore[arg-type]

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
        ConditionCheck on the attempt and the put."""
        e = _Expr()
        check = self._tx_check(_key(ref.tenant, ref.run_id, _attempt_sk(ref.index, ref.n)), e, _fence(e, ref))
        try:
            self._transact([check, self._tx_put(item)])
        except _Refused as refused:
            raise _attempt_ended(ref, refused.found(0)) from None

    @_operation
    def put_call(self, ref: AttemptRef, call: ModelCall) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            span = {"pk": _pk(ref.tenant, ref.run_id), "sk": _call_sk(ref.index, call.id), "n": call.n, "body": call.model_dump_json()}
            item = blobs.item(span)
            self._fenced_put(ref, _encode(item))

    @_operation
    def set_prompt_layers(self, ref: AttemptRef, layers: list[PromptLayer]) -> None:
        with self._blobs(ref.tenant, ref.run_id) as blobs:
            kept = blobs.attrs(_attempt_sk(ref.index, ref.n), {"layers": _layers_json(layers)})["layers"]
            self._fenced_update(ref, _Update().set("layers", kept))

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
        # Each waiting token is an item of its own (a lane may have hundreds of siblings, and a
        # callback token is ~1 KB), put only while the gate is closed.
        e = _Expr()
        closed = self._tx_check(_key(tenant, run_id, f"G#{key}"), e, e.absent("opened_at"))
        item = {"pk": _pk(tenant, run_id), "sk": _gate_token_prefix(key) + _digest(token), "token": token}
        try:
            self._transact([closed, self._tx_put(_encode(item))])
        except _Refused:
            return True
        return False

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
