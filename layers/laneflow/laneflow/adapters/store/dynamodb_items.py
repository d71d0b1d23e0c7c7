"""The DynamoDB store's items: keys, values as AttributeValues, sizes by DynamoDB's rules,
and what a step item keeps (see laneflow.adapters.store.dynamodb for the layout)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
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
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from laneflow.adapters.store.encoding import COST_DECIMALS, dumps, worker_text
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import Attempt, ModelCall, PromptLayer, Run, RunStatus, Step
from laneflow.domain.tenants import check_tenant
from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution

if TYPE_CHECKING:
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef

    from laneflow.adapters.store.dynamodb_expr import Update

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

# Step fields a step item leaves out while they hold their defaults (absent reads as the
# default; none is named in a key, a condition or a filter): a new step item is ~70 bytes
# smaller, and every write of it is billed on the whole item.
STEP_DEFAULTS: dict[str, Any] = {
    name: Step.model_fields[name].default
    for name in (
        "entry",
        "slot",
        "cycle",
        "instruction",
        "item",
        "data",
        "optional",
        "cache_break",
        "prefix",
        "cost_usd",
        "savings_usd",
    )
}

# Step fields a step item keeps under short names, as it keeps an attempt's record (none is
# named in a key, a condition, a filter or a projection): DynamoDB bills an item's attribute
# names with its values, ~60 bytes of a completed stub step. An item written before keeps
# the field's own name, which reads still accept.
STEP_SHORT = {
    "entry": "en",
    "slot": "sl",
    "item": "it",
    "instruction": "in",
    "message": "m",
    "result": "r",
    "conclusion": "c",
    "data": "d",
    "skip_reason": "sr",
    "error": "er",
    "finished_at": "f",
    "cache_break": "cb",
    "prefix": "p",
    "cache_ttl": "tt",
    "cache_ttl_reason": "tr",
}

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
        *(STEP_SHORT[f] for f in ("item", "data", "instruction", "message", "result", "conclusion", "error", "skip_reason")),
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


# Fields a step item (or an attempt or journal entry moved off it) may keep as epoch
# milliseconds (pack_time): the times of attempts and journal entries, and a step's
# finished_at (never its started_at, which a filter compares as text). `fields` reads them.
TIME_FIELDS = frozenset({"started_at", "resumed_at", "ended_at", "heartbeat_at", "created_at", "finished_at"})

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def unpack_time(value: Any) -> Any:
    """A time as `pack_time` kept it, as its text (anything else as it is)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (_EPOCH + _dt.timedelta(milliseconds=value)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return value


def pack_time(text: str | None) -> str | int | None:
    """A time as a step item keeps it where no condition compares it with text: one of ours
    (ISO-8601 UTC with milliseconds and a Z, as records.utcnow makes them) as its epoch
    milliseconds, 8 bytes and not 24; any other text as it is."""
    if text is None or not _TIME.fullmatch(text):
        return text
    at = _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    ms = (at - _EPOCH) // _dt.timedelta(milliseconds=1)
    return ms if unpack_time(ms) == text else text


def time_of(av: Mapping[str, Any] | None) -> str | None:
    """A time of an attempt record or a journal entry, from its AttributeValue."""
    if not av:
        return None
    return unpack_time(int(av["N"])) if "N" in av else av.get("S")


STEP_FIELD = {short: field for field, short in STEP_SHORT.items()}


def step_name(field: str) -> str:
    """The attribute a step item keeps a field under."""
    return STEP_SHORT.get(field, field)


def attr_field(sk: str, attr: str) -> str:
    """What an item's attribute is called where a person reads it (an error, a blob's key):
    a step item's short names as their fields."""
    return STEP_FIELD.get(attr, attr) if sk.startswith("S#") else attr


def set_step_field(u: Update, field: str, value: Any) -> None:
    """Set a step field in an Update (`value` as `step_attr` made it; None removes it, under
    the field's own name too, where an item written before keeps it)."""
    u.set(step_name(field), value)
    if value is None and step_name(field) != field:
        u.remove(field)


def step_attr(field: str, value: Any) -> Any:
    """A step field's value as its item keeps it (None: absent, as it is at its default)."""
    if field in STEP_DEFAULTS and value == STEP_DEFAULTS[field]:
        return None
    if field == "finished_at":
        return pack_time(value)
    return to_attr(field, value)


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
    """Prompt layers as a step item keeps them: `[name, chars, sha256]` each, and a 1 when it
    is dynamic (about 40 % of the records' own JSON)."""
    return dumps([[layer.name, layer.chars, layer.sha256, *([1] if layer.dynamic else [])] for layer in layers])


def layers_of(text: str) -> list[dict[str, Any]]:
    """Prompt layers as kept, as records' fields (an older item keeps each as its record)."""
    out = []
    for each in json.loads(text):
        if isinstance(each, dict):
            out.append(each)
        else:
            name, chars, sha256, *dynamic = each
            out.append({"name": name, "chars": chars, "sha256": sha256, "dynamic": bool(dynamic and dynamic[0])})
    return out


def lean(record: BaseModel) -> dict[str, Any]:
    """A record's fields as JSON, those at their defaults left out (a field whose default is
    made afresh is kept, unless it is a record all of whose fields are at theirs)."""
    out: dict[str, Any] = {}
    for name, field in type(record).model_fields.items():
        value = getattr(record, name)
        if isinstance(value, BaseModel):
            inner = lean(value)
            if inner or value != field.get_default(call_default_factory=True):
                out[name] = inner
        elif field.default_factory is not None or value != field.default:
            out[name] = to_jsonable_python(value)
    return out


def span_text(call: ModelCall) -> str:
    """A span as a step keeps it: its fields but its id (the map's key or the item's sort key
    says it), those at their defaults left out (~130 bytes of a stub's span, not ~300)."""
    fields = {k: v for k, v in lean(call).items() if k != "id"}
    return dumps({**fields, "at": pack_time(fields["at"])} if "at" in fields else fields)


def span_of(call_id: str, text: str) -> dict[str, Any]:
    """A span as kept, as the record's fields (an older one kept its id and every field)."""
    fields = json.loads(text)
    return {"id": call_id, **fields, **({"at": unpack_time(fields["at"])} if "at" in fields else {})}


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
