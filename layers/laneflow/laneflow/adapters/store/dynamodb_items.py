"""The DynamoDB store's items: keys, values as AttributeValues, sizes by DynamoDB's rules,
and what a step item keeps (see laneflow.adapters.store.dynamodb for the layout)."""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import threading
import time
from collections.abc import Mapping
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from laneflow.adapters.store.encoding import COST_DECIMALS, dumps, worker_text
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import Attempt, PromptLayer, Run, RunStatus, Step
from laneflow.domain.tenants import check_tenant
from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution

if TYPE_CHECKING:
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]  # an item as DynamoDB reads and writes it

_SERIALIZER = TypeSerializer()

_DESERIALIZER = TypeDeserializer()

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


_WORKERS = (LocalProcess, LambdaRequest, StepFunctionsExecution, FargateTask)

ACTIVE_RUN = frozenset({RunStatus.queued.value, RunStatus.running.value, RunStatus.awaiting_approval.value})


# How a model field is kept. JSON fields are kept as JSON text (exact types, floats and
# nulls included); everything else as a plain string, number or boolean.
JSON_FIELDS = frozenset({"input", "flow_spec", "options", "item", "data", "cache_break", "prefix"})

RUN_BODY = ("input", "flow_spec")  # written once; kept apart so per-step cost updates stay small

RUN_HEAD = tuple(f for f in Run.model_fields if f not in {"steps", *RUN_BODY})

STEP_ATTRS = tuple(f for f in Step.model_fields if f not in {"events", "calls", "prompt_layers"})

STEP_ATTRS_WITHOUT_MESSAGE = tuple(f for f in STEP_ATTRS if f != "message")

ATTEMPT_FIELDS = tuple(Attempt.model_fields)

# An attempt's record on its step item: field -> the short name it is kept under.
RECORD = {
    "token": "t",
    "started_at": "s",
    "resumed_at": "r",
    "status": "st",
    "ended_at": "e",
    "reason": "why",
    "reason_kind": "k",
    "worker": "w",
    "heartbeat_at": "hb",
    "op_id": "op",
}

RECORD_FIELD = {short: field for field, short in RECORD.items()}

ATTEMPT_ATTR = re.compile(r"A(\d+)")

JOURNAL_ATTR = re.compile(r"J[0-9a-f]{16}")

# Attributes that may move to S3 (never keys, identities or statuses: conditions read those).
BLOBBABLE = frozenset(
    {
        "input",
        "flow_spec",
        "options",
        "item",
        "data",
        "instruction",
        "message",
        "result",
        "conclusion",
        "error",
        "skip_reason",
        "reason",
        "worker",
        "layers",
        "text",
        "body",
        "why",
        "w",
    }
)


# -- values --------------------------------------------------------------------------------


def item_name(item: Item) -> str:
    """An item as a person names it: `run 'ID'` or `step N of run 'ID'`."""
    try:
        _, run_id = tenant_run(item["pk"]["S"])
        sk = item["sk"]["S"]
    except (KeyError, TypeError, ValueError):
        return "a record"
    return f"step {int(sk[2:])} of run {run_id!r}" if sk.startswith("S#") and sk[2:].isdigit() else f"run {run_id!r}"


def decimal_cost(value: Any) -> Decimal:
    return Decimal(str(round(float(value), COST_DECIMALS)))


def to_attr(field: str, value: Any) -> Any:
    """A model field's value as it is kept (None: the attribute is absent)."""
    if field in JSON_FIELDS:
        return dumps(value)
    if value is None:
        return None
    if isinstance(value, _WORKERS):
        return worker_text(value)
    if field in ("cost_usd", "savings_usd"):
        return decimal_cost(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (bool, int, str, Decimal)):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    raise TypeError(f"DynamoStore does not know how to keep field {field!r} ({type(value).__name__}); add it to JSON_FIELDS")


def to_av(value: Any) -> AttributeValueTypeDef:
    """A Python value as a DynamoDB AttributeValue (boto3's `TypeSerializer`: a number's text
    is its Decimal's, a float is refused - `to_attr` keeps a float field as a Decimal)."""
    return _SERIALIZER.serialize(value)


def to_number(text: str) -> int | float:
    """A stored number (its `N` text) as a model field reads it: int when it is a whole
    number's digits, else float."""
    return int(text) if text.lstrip("-").isdigit() else float(Decimal(text))


def from_av(av: AttributeValueTypeDef) -> Any:
    """An AttributeValue as Python (boto3's `TypeDeserializer`), a number as `to_number`
    reads its text."""
    value = _DESERIALIZER.deserialize(av)
    return to_number(str(value)) if isinstance(value, Decimal) else value


def av_size(av: Mapping[str, Any]) -> int:
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
        return 3 + sum(len(k.encode()) + av_size(v) + 1 for k, v in value.items())
    if kind == "L":
        return 3 + sum(av_size(v) + 1 for v in value)
    return 1  # BOOL, NULL


def item_size(item: Mapping[str, Mapping[str, Any]]) -> int:
    return sum(len(name.encode()) + av_size(av) for name, av in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units(size: int) -> int:
    return max(1, math.ceil(size / 4096))


# -- keys ----------------------------------------------------------------------------------


# Every key naming a tenant is built by one of these three, so each checks the tenant: a `#`
# in it would run into the next part of the key (TenantInvalid, a 400, never a 500).
def pk_of(tenant: str, run_id: str) -> str:
    return f"T#{check_tenant(tenant)}#R#{run_id}"


def key_of(tenant: str, run_id: str, sk: str) -> Item:
    return {"pk": {"S": pk_of(tenant, run_id)}, "sk": {"S": sk}}


def step_sk(index: int) -> str:
    return f"S#{index:08d}"


def attempt_sk(index: int, n: int) -> str:
    return f"A#{index:08d}#{n:06d}"


def trace_prefix(index: int) -> str:
    return f"T#{index:08d}#"


def event_sk(index: int, seq: str) -> str:
    return f"{trace_prefix(index)}E#{seq}"


def call_sk(index: int, call_id: str) -> str:
    return f"{trace_prefix(index)}C#{call_id}"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def attempt_attr(n: int) -> str:
    return f"A{n}"


def journal_attr(op_id: str) -> str:
    """The step item's attribute of an op_id's journal entry."""
    return "J" + digest(op_id)[:16]


def moved_journal_sk(op_id: str) -> str:
    """Where an op_id's settled entry goes once its step has kept enough."""
    return "J#" + digest(op_id)[:16]


def tenant_run(pk: str) -> tuple[str, str]:
    tenant, _, run_id = pk.removeprefix("T#").partition("#R#")
    return tenant, run_id


def gate_token_prefix(key: str) -> str:
    return f"GT#{digest(key)}#"


def runs_pk(tenant: str) -> str:
    return f"T#{check_tenant(tenant)}#RUNS"


def live_pk(tenant: str, kind: str) -> str:
    return f"T#{check_tenant(tenant)}#LIVE#{kind}"


def live_sk(run_id: str, index: int) -> str:
    return f"{run_id}#{index:08d}"


NOTE_PREFIX = "N#"  # a note of a step's inbox: N#<note id>

OBSERVED_PREFIX = "O#"  # what an attempt observed: O#<idx>#<n>#<seq>

PREFIX_SK = "PREFIX"  # a prefix registry record's sort key (its pk names the tenant and the key)

SCHEDULE_PREFIX = "SCHEDULE#"  # a schedule's sort key: SCHEDULE#<id> (in its tenant's T#<tenant>#SCHEDULES)

# kind -> the sk its items start with
LIVE_KINDS = {"RUN": RUN_SK, "STEP": "S#", "ASK": NOTE_PREFIX, "PFX": PREFIX_SK, "SCHED": SCHEDULE_PREFIX}


class Sequence:
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


SEQUENCE = Sequence()


def record_of(item: Item | None, n: int) -> Mapping[str, Any] | None:
    """Attempt n's record on a step item (its AttributeValue map), if the item keeps it."""
    if item is None:
        return None
    return item.get(attempt_attr(n), {}).get("M")


def pending_journal(item: dict[str, Any]) -> int:
    return int(item["jp"]["N"]) if "jp" in item else 0


def plain(**values: Any) -> dict[str, Any]:
    """A map's values, those that are None left out."""
    return {k: v for k, v in values.items() if v is not None}


def encode(attrs: dict[str, Any]) -> Item:
    """An item of plain values as DynamoDB AttributeValues (None values left out)."""
    return {k: to_av(v) for k, v in attrs.items() if v is not None}


def layers_json(layers: list[PromptLayer]) -> str:
    return dumps([layer.model_dump() for layer in layers])


def first_of(items: list[Item], where: StepFilter) -> list[Item]:
    """Of step items in index order, each (agent, model)'s first `per_lane`, then the first
    `limit`: filters DynamoDB cannot apply (its own Limit counts items before filtering)."""
    if where.per_lane is not None:
        seen: dict[tuple[str, str], int] = {}
        firsts = []
        for item in items:
            lane = (str((item.get("agent") or {}).get("S", "")), str((item.get("model") or {}).get("S", "")))
            if seen.get(lane, 0) < where.per_lane:
                seen[lane] = seen.get(lane, 0) + 1
                firsts.append(item)
        items = firsts
    return items if where.limit is None else items[: where.limit]
