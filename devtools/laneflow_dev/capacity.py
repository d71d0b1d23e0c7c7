"""Write capacity units counted from outside a DynamoDB client, by DynamoDB's own rules.

`WriteMeter` hooks a client's events (`before-call.dynamodb` / `after-call.dynamodb`): for
every write request (PutItem, UpdateItem, DeleteItem, TransactWriteItems, BatchWriteItem,
refused ones included) it reads each item the request names as the table holds it before,
and after (an update that asked for its item back, ALL_NEW, has DynamoDB's answer as that),
through a client of its own, and charges the request by the item-size rules of the DynamoDB
developer guide ("DynamoDB item sizes and formats", "read and write operations"):

- an item's size is the sum of its attribute names' UTF-8 bytes and its values' sizes: a
  string its UTF-8 bytes, a number 1 byte per two significant digits (leading and trailing
  zeros trimmed) plus 1, binary its raw bytes, a boolean or null 1, a list or map 3 bytes
  plus each element's size plus 1 byte per element (a map's keys count as names), a set its
  elements;
- a write costs 1 WCU per started KB of the larger of the item before and after it (a
  put's replaced item, an update's before and after images, a delete's deleted item; 1 WCU
  at least, a delete of nothing included);
- a refused conditional write still consumes: the larger of the item found and (a put) the
  item it would have written;
- every action of a TransactWriteItems costs twice (a ConditionCheck on the size of the
  item it checks); a cancelled transaction is charged the same on what it found;
- a secondary index entry written costs by its projected entry (its keys, the table's keys
  and what it projects), as DynamoDB charges it: joining or leaving the index 1 write of the
  entry, a changed entry under the same key the larger of the two, a moved key both, an
  entry left as it was nothing (once, in a transaction too).

The guide does not say what a cancelled transaction or a ConditionCheck consumes; the meter
charges both as transactional writes of the items they name, as found (an upper bound).
BatchWriteItem's unprocessed items are charged too (moto leaves none).

Nothing here reads the store's own arithmetic: the meter sees only requests and items.
"""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3

WRITE_REQUESTS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})

_PENDING = "laneflow_write_meter"  # the key of a request's before images in botocore's request context


def value_size(av: Mapping[str, Any]) -> int:
    """Bytes one AttributeValue counts for (its name not included)."""
    ((kind, value),) = av.items()
    if kind == "S":
        return len(value.encode("utf-8"))
    if kind == "N":
        return number_size(value)
    if kind == "B":
        return len(value) if isinstance(value, bytes) else len(_b64(value))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(v.encode("utf-8")) for v in value)
    if kind == "NS":
        return sum(number_size(v) for v in value)
    if kind == "BS":
        return sum(len(v) if isinstance(v, bytes) else len(_b64(v)) for v in value)
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in value)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + value_size(v) + 1 for k, v in value.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def number_size(text: str) -> int:
    digits = text.lstrip("-+").lower().split("e")[0].replace(".", "").strip("0")
    return (len(digits) + 1) // 2 + 1


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    """Bytes an item counts for; 0 for no item."""
    if not item:
        return 0
    return sum(len(name.encode("utf-8")) + value_size(av) for name, av in item.items())


def write_units(size: int) -> int:
    """WCU of one write of an item of `size` bytes: 1 per started KB, at least 1."""
    return max(1, math.ceil(size / 1024))


@dataclass(frozen=True)
class Index:
    name: str
    keys: tuple[str, ...]
    projection: str  # KEYS_ONLY, INCLUDE or ALL
    included: tuple[str, ...] = ()

    def entry(self, item: Mapping[str, Any] | None, table_keys: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
        """(its key, the entry) of an item in this index; None if the item is not in it."""
        if not item or any(k not in item or not ({"S", "N", "B"} & set(item[k])) for k in self.keys):
            return None
        if self.projection == "ALL":
            projected = dict(item)
        else:
            names = {*table_keys, *self.keys, *(self.included if self.projection == "INCLUDE" else ())}
            projected = {k: v for k, v in item.items() if k in names}
        return tuple(json.dumps(item[k], sort_keys=True) for k in self.keys), projected

    def units(self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, table_keys: tuple[str, ...]) -> int:
        old, new = self.entry(before, table_keys), self.entry(after, table_keys)
        if old is None and new is None:
            return 0
        if old is None or new is None:
            return write_units(item_size((old or new)[1]))  # type: ignore[index]
        if old[0] != new[0]:
            return write_units(item_size(old[1])) + write_units(item_size(new[1]))
        if old[1] == new[1]:
            return 0
        return max(write_units(item_size(old[1])), write_units(item_size(new[1])))


@dataclass(frozen=True)
class Schema:
    keys: tuple[str, ...]
    indexes: tuple[Index, ...]


@dataclass(frozen=True)
class Write:
    """What one item of one write request cost: who asked (`label`), the request, the
    action in it, the item's kind and key (its key values, " / " between them), its table
    and index units, and whether it was refused."""

    label: str
    request: str
    action: str
    kind: str
    key: str
    table: int
    index: int
    refused: bool

    @property
    def units(self) -> int:
        return self.table + self.index


@dataclass
class _Target:
    table: str
    action: str  # Put, Update, Delete, ConditionCheck
    key: dict[str, Any]
    new: dict[str, Any] | None = None  # a put's item


class WriteMeter:
    """Every write request `client` makes, charged by the items before and after it.

    `label` names what asked for a request (called in the requesting thread: a store's
    current operation); `kind` names an item's kind from its key. A write holds the items it
    names from its before read to its after read, so a concurrent write to the same item never
    lands between them; writes to other items go on meanwhile (the meter's reads slow every
    write all the same: two or three requests, not one)."""

    def __init__(
        self,
        client: Any,
        *,
        label: Callable[[], str] = lambda: "",
        kind: Callable[[Mapping[str, Any]], str] = lambda key: "item",
    ) -> None:
        self._client, self._label, self._kind = client, label, kind
        self._peek = boto3.session.Session().client(
            "dynamodb", region_name=client.meta.region_name, endpoint_url=client.meta.endpoint_url
        )
        self._schemas: dict[str, Schema] = {}
        self._held: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)  # by item
        self._lock = threading.Lock()  # the meter's own state: its item locks and its writes
        self.writes: list[Write] = []
        events = client.meta.events
        events.register("before-call.dynamodb", self._before, unique_id=f"write-meter-before-{id(self)}")
        events.register("after-call.dynamodb", self._after, unique_id=f"write-meter-after-{id(self)}")
        events.register("after-call-error.dynamodb", self._failed, unique_id=f"write-meter-error-{id(self)}")

    def close(self) -> None:
        events = self._client.meta.events
        events.unregister("before-call.dynamodb", unique_id=f"write-meter-before-{id(self)}")
        events.unregister("after-call.dynamodb", unique_id=f"write-meter-after-{id(self)}")
        events.unregister("after-call-error.dynamodb", unique_id=f"write-meter-error-{id(self)}")
        self._peek.close()

    # -- what was counted ----------------------------------------------------------------

    def take(self) -> list[Write]:
        """The writes counted since the last take, and start again."""
        with self._lock:
            taken, self.writes = self.writes, []
        return taken

    @staticmethod
    def total(writes: Iterable[Write]) -> int:
        return sum(w.units for w in writes)

    @staticmethod
    def breakdown(writes: Iterable[Write]) -> dict[tuple[str, str, str], dict[str, int]]:
        """(label, request and action, item kind) -> units, table units, index units, items."""
        rows: defaultdict[tuple[str, str, str], dict[str, int]] = defaultdict(
            lambda: {"units": 0, "table": 0, "index": 0, "items": 0, "refused": 0}
        )
        for w in writes:
            row = rows[(w.label, w.request if w.request != "TransactWriteItems" else f"Transact.{w.action}", w.kind)]
            row["units"] += w.units
            row["table"] += w.table
            row["index"] += w.index
            row["items"] += 1
            row["refused"] += int(w.refused)
        return dict(rows)

    # -- the hooks -------------------------------------------------------------------------

    def _before(self, model: Any, params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        if model.name not in WRITE_REQUESTS:
            return
        body = json.loads(params.get("body") or b"{}")
        targets = self._targets(model.name, body)
        held = self._hold(targets)
        try:
            new_image = model.name == "UpdateItem" and body.get("ReturnValues") == "ALL_NEW"
            context[_PENDING] = (model.name, self._label(), targets, [self._read(t) for t in targets], held, new_image)
        except BaseException:
            _release(held)
            raise

    def _after(self, model: Any, http_response: Any, parsed: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        pending = context.pop(_PENDING, None)
        if pending is None:
            return
        request, label, targets, befores, held, new_image = pending
        try:
            status = getattr(http_response, "status_code", 500)
            code = (parsed.get("Error") or {}).get("Code", "")
            refused = code in ("ConditionalCheckFailedException", "TransactionCanceledException")
            if status >= 300 and not refused:
                return  # not served (a validation error, a throttle): nothing consumed
            if refused:
                afters = befores
            elif new_image:  # DynamoDB answered with the item after the update: no read needed
                afters = [dict(parsed.get("Attributes") or {}) or None]
            else:
                afters = [self._read(t) for t in targets]
            self._charge(request, label, targets, befores, afters, refused)
        finally:
            _release(held)

    def _failed(self, context: dict[str, Any], **_: Any) -> None:
        pending = context.pop(_PENDING, None)
        if pending is not None:
            _release(pending[4])

    def _hold(self, targets: list[_Target]) -> list[threading.Lock]:
        """The locks of the items a write names, taken in one order (so two writes never wait
        on each other's)."""
        names = sorted({f"{t.table}/{json.dumps(t.key, sort_keys=True)}" for t in targets})
        with self._lock:
            locks = [self._held[name] for name in names]
        for lock in locks:
            lock.acquire()
        return locks

    # -- reading and charging ----------------------------------------------------------------

    def _schema(self, table: str) -> Schema:
        if table not in self._schemas:
            desc = self._peek.describe_table(TableName=table)["Table"]
            indexes = tuple(
                Index(
                    name=i["IndexName"],
                    keys=tuple(k["AttributeName"] for k in i["KeySchema"]),
                    projection=i["Projection"]["ProjectionType"],
                    included=tuple(i["Projection"].get("NonKeyAttributes", ())),
                )
                for i in desc.get("GlobalSecondaryIndexes", []) + desc.get("LocalSecondaryIndexes", [])
            )
            self._schemas[table] = Schema(keys=tuple(k["AttributeName"] for k in desc["KeySchema"]), indexes=indexes)
        return self._schemas[table]

    def _targets(self, request: str, body: Mapping[str, Any]) -> list[_Target]:
        def keyed(table: str, item: Mapping[str, Any]) -> dict[str, Any]:
            return {k: item[k] for k in self._schema(table).keys}

        if request == "PutItem":
            return [_Target(body["TableName"], "Put", keyed(body["TableName"], body["Item"]), body["Item"])]
        if request in ("UpdateItem", "DeleteItem"):
            return [_Target(body["TableName"], request.removesuffix("Item"), body["Key"])]
        if request == "BatchWriteItem":
            out = []
            for table, requests in body["RequestItems"].items():
                for each in requests:
                    if "PutRequest" in each:
                        item = each["PutRequest"]["Item"]
                        out.append(_Target(table, "Put", keyed(table, item), item))
                    else:
                        out.append(_Target(table, "Delete", each["DeleteRequest"]["Key"]))
            return out
        out = []
        for each in body["TransactItems"]:
            ((action, spec),) = each.items()
            if action == "Put":
                out.append(_Target(spec["TableName"], "Put", keyed(spec["TableName"], spec["Item"]), spec["Item"]))
            else:
                out.append(_Target(spec["TableName"], action, spec["Key"]))
        return out

    def _read(self, target: _Target) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._peek.get_item(TableName=target.table, Key=target.key, ConsistentRead=True).get("Item")
        return item

    def _charge(
        self,
        request: str,
        label: str,
        targets: list[_Target],
        befores: list[dict[str, Any] | None],
        afters: list[dict[str, Any] | None],
        refused: bool,
    ) -> None:
        factor = 2 if request == "TransactWriteItems" else 1
        charged = []
        for target, before, after in zip(targets, befores, afters, strict=True):
            schema = self._schema(target.table)
            if target.action == "ConditionCheck":
                table, index = write_units(item_size(before)), 0
            elif refused:
                table, index = write_units(max(item_size(before), item_size(target.new))), 0
            elif target.action == "Delete":
                table = write_units(item_size(before))
                index = sum(i.units(before, None, schema.keys) for i in schema.indexes)
            else:
                table = write_units(max(item_size(before), item_size(after)))
                index = sum(i.units(before, after, schema.keys) for i in schema.indexes)
            key = " / ".join(str(next(iter(target.key[k].values()))) for k in schema.keys)
            charged.append(Write(label, request, target.action, self._kind(target.key), key, factor * table, index, refused))
        with self._lock:
            self.writes += charged


def _release(locks: list[threading.Lock]) -> None:
    for lock in reversed(locks):
        lock.release()


def laneflow_kind(key: Mapping[str, Any]) -> str:
    """The kind of a laneflow store item, from its sort key (the item layout of
    laneflow.adapters.store.dynamodb)."""
    sk = str(key.get("sk", {}).get("S", ""))
    if sk.startswith("T#"):
        return {"E": "event", "C": "span"}.get(sk[11:12], "trace")
    for prefix, kind in (
        ("RUN#INPUT", "run input"),
        ("RUN", "run"),
        ("S#", "step"),
        ("A#", "older attempt"),
        ("J#", "older journal entry"),
        ("H#", "handoff"),
        ("GT#", "gate token"),
        ("G#", "gate"),
        ("N#", "note"),
        ("O#", "observed"),
        ("PREFIX", "prefix"),
    ):
        if sk.startswith(prefix):
            return kind
    return "other"
