"""The DynamoDB store's requests: one table and its blob bucket, what each request
consumes, and the errors DynamoDB answers turned into the store's (a refused condition,
an item too large, a throttle that outlasted the client's retries)."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, cast

from botocore.exceptions import ClientError

from laneflow.adapters.store.dynamodb_blobs import Blobs, ItemTooLarge, blobs_of, too_large
from laneflow.adapters.store.dynamodb_expr import Expr, Update
from laneflow.adapters.store.dynamodb_items import (
    JSON_FIELDS,
    LIVE_INDEX,
    LIVE_KINDS,
    TIME_FIELDS,
    from_av,
    item_name,
    item_size,
    live_pk,
    read_units,
    unpack_time,
    write_units,
)
from laneflow.adapters.store.rulebook_base import damaged
from laneflow.domain import jsonsafe
from laneflow.domain.errors import Conflict, TransientError

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef
    from types_boto3_s3 import S3Client

    from laneflow.adapters.store.dynamodb_items import Item

# Answers that mean "not now": DynamoDB throttled the request, or failed on its side. The
# client retries them first (standard mode); what outlasts that is the store's
# TransientError, which the state machine retries by name.
THROTTLED = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)

# Batch requests made again for what DynamoDB left unprocessed (it does under throttling),
# backing off 10 ms doubling up to 1 s: ~4 s of pauses in all before the store stops asking.
UNPROCESSED_TRIES = 10

# A transaction made again when it conflicted with another on the same items, after a random
# pause of up to 10 ms doubling (~5 s of pauses in all, on average): a conflict is a turn lost
# to a concurrent writer, and ten in a row means the items are too hot to wait for.
CONFLICT_TRIES = 10

_THROTTLED_REASONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"})


def transient(error: ClientError) -> TransientError | None:
    """The TransientError a throttle or a DynamoDB failure (5xx) is; None for anything else."""
    code = error.response.get("Error", {}).get("Code", "")
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in THROTTLED or status >= 500:
        message = error.response.get("Error", {}).get("Message", "")
        return TransientError(f"DynamoDB could not serve the request now ({code or status}): {message}")
    return None


class ConditionFailed(Exception):
    """A conditional write (or one action of a transaction) was refused. `reasons` has one
    entry per action: its code ('None' when it was fine) and the item as it was found."""

    def __init__(self, reasons: list[dict[str, Any]]):
        super().__init__(reasons)
        self.reasons = reasons

    def failed(self, action: int) -> bool:
        return self.reasons[action].get("Code") == "ConditionalCheckFailed"

    def found(self, action: int) -> Item | None:
        return self.reasons[action].get("Item") or None


class Meter:
    """Capacity units and requests by operation (see laneflow.adapters.store.dynamodb)."""

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
            out: dict[str, dict[str, float]] = {
                "read": dict(self._units["read"]),
                "write": dict(self._units["write"]),
                "requests": dict(self._requests),
            }
            if reset:
                self._reset()
            return out


class Table:
    """One table (`name`) and its blob bucket, through clients made once (safe to use from
    many threads). Every request is counted under the operation it serves (`operation`)."""

    def __init__(self, db: DynamoDBClient, s3: S3Client, name: str, bucket: str | None, blob_threshold: int) -> None:
        self._db, self._s3 = db, s3
        self.name, self.bucket, self.blob_threshold = name, bucket, blob_threshold
        self.meter = Meter()
        self._op = threading.local()

    @contextmanager
    def operation(self, name: str) -> Iterator[None]:
        """Count what is consumed inside under `name` (an operation inside another counts
        under the outer one)."""
        if getattr(self._op, "name", None):
            yield
            return
        self._op.name = name
        try:
            yield
        finally:
            self._op.name = None

    def blobs(self, tenant: str, run_id: str) -> Any:
        """Where one write's large values go (a context: what it uploaded goes if it fails)."""
        return blobs_of(self._s3, self.bucket, self.blob_threshold, tenant, run_id)

    def _client_call(self, call: Callable[..., Mapping[str, Any]], **kwargs: Any) -> Mapping[str, Any]:
        try:
            return call(**kwargs)
        except ClientError as error:
            _reraise(error)

    def current_operation(self) -> str:
        """The operation this thread's requests count under now ("other" outside one)."""
        return getattr(self._op, "name", None) or "other"

    def count(self, *, read: float = 0.0, write: float = 0.0) -> None:
        self.meter.count(self.current_operation(), read=read, write=write)

    def request(self, method: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB request; a refused condition raises `ConditionFailed`, an item too large
        `ItemTooLarge`."""
        try:
            response: dict[str, Any] = getattr(self._db, method)(TableName=self.name, **kwargs)
            return response
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            message = error.response.get("Error", {}).get("Message", "")
            if code == "ConditionalCheckFailedException":
                # Refused, it consumed all the same: on the item found (and a put's item).
                found = cast("Item | None", error.response.get("Item"))
                put: Item = kwargs.get("Item") or {}
                self.count(write=write_units(max(item_size(found or {}), item_size(put))))
                raise ConditionFailed([{"Code": "ConditionalCheckFailed", "Item": found}]) from None
            if code == "ValidationException" and "size" in message.lower():
                raise too_large(message, self.bucket) from None
            _reraise(error)

    def get(self, key: Item) -> Item | None:
        item = self.request("get_item", Key=key, ConsistentRead=True).get("Item")
        self.count(read=read_units(item_size(item) if item else 0))
        return item

    def query(self, *, index: str | None = None, **kwargs: Any) -> list[Item]:
        """Every item a Query names, page by page (strongly consistent on the table)."""
        items: list[Item] = []
        params = dict(kwargs, **({"IndexName": index} if index else {"ConsistentRead": True}))
        while True:
            page = self.request("query", **params)
            items += page.get("Items", [])
            size = sum(item_size(i) for i in page.get("Items", []))
            self.count(read=read_units(size) * (0.5 if index else 1.0))
            if "LastEvaluatedKey" not in page:
                return items
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def query_prefix(self, pk: str, prefix: str, *, where: Callable[[Expr], str] | None = None) -> list[Item]:
        """The items of a partition whose sort key starts with `prefix` (and that `where`,
        given the request's expression, filters in)."""
        e = Expr()
        params: dict[str, Any] = {
            "KeyConditionExpression": f"{e.n('pk')} = {e.v(pk)} AND begins_with({e.n('sk')}, {e.v(prefix)})"
        }
        if where is not None:
            params["FilterExpression"] = where(e)
        return self.query(**params, **e.params())

    def query_range(self, pk: str, low: str, high: str | None = None) -> list[Item]:
        e = Expr()
        sk = e.n("sk")
        between = f"{sk} BETWEEN {e.v(low)} AND {e.v(high)}" if high else f"{sk} >= {e.v(low)}"
        return self.query(KeyConditionExpression=f"{e.n('pk')} = {e.v(pk)} AND {between}", **e.params())

    def batch_get(self, keys: list[Item]) -> list[Item]:
        """The items of `keys` (strongly consistent), in no particular order."""
        items: list[Item] = []
        for start in range(0, len(keys), 100):
            pending: dict[str, Any] = {self.name: {"Keys": keys[start : start + 100], "ConsistentRead": True}}
            for attempt in range(UNPROCESSED_TRIES):
                page = self._client_call(self._db.batch_get_item, RequestItems=pending)
                got = page.get("Responses", {}).get(self.name, [])
                items += got
                self.count(read=sum(read_units(item_size(i)) for i in got))
                pending = page.get("UnprocessedKeys") or {}
                if not pending:
                    break
                time.sleep(min(1.0, 0.01 * 2**attempt))
        return items

    def put(self, item: Item, condition: str | None = None, e: Expr | None = None, *, indexes: int = 0) -> None:
        extra: dict[str, Any] = {}
        if condition:
            extra = {"ConditionExpression": condition, "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **(e or Expr()).params()}
        self.request("put_item", Item=item, **extra)
        self.count(write=write_units(item_size(item)) + indexes)

    def update(
        self,
        key: Item,
        u: Update,
        condition: str | None = None,
        *,
        returns: str = "NONE",
        indexes: int | Callable[[dict[str, Any]], int] = 0,
        blobs: Blobs | None = None,
        size: int = 0,
    ) -> Item | None:
        """One UpdateItem. If the item would pass 400 KB with what it already holds (the
        store sees only what it writes) and `blobs` can take them, the write's large values go
        to S3 and it is made once more. Counted on the larger of `size` (the item as read
        before) and the item after it (ALL_NEW) or what it writes; `indexes` may be decided
        from the item after it."""
        extra: dict[str, Any] = {}
        if condition:
            extra = {"ConditionExpression": condition, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}

        def request() -> dict[str, Any]:
            return self.request(
                "update_item", Key=key, UpdateExpression=u.expression(), ReturnValues=returns, **u.params(), **extra
            )

        try:
            reply = request()
        except ItemTooLarge:
            if blobs is None or not blobs.squeeze(key["sk"]["S"], u):
                raise
            reply = request()
        item = reply.get("Attributes")
        written = item_size(item) if item and returns == "ALL_NEW" else item_size(key) + u.payload()
        index_writes = indexes(item or {}) if callable(indexes) else indexes
        self.count(write=write_units(max(size, written)) + index_writes)
        return item

    def transact(
        self,
        actions: list[tuple[dict[str, Any], int]],
        *,
        indexes: int = 0,
        squeeze: tuple[Blobs, list[tuple[str, Update]]] | None = None,
    ) -> None:
        """One TransactWriteItems of (action, size) pairs: all land or none. A refused
        condition raises `ConditionFailed` with a reason per action; a conflict with a concurrent
        transaction on the same items is retried; an item that would pass 400 KB gets the
        large values of `squeeze`'s updates moved to S3 and is tried once more."""
        try:
            self.transact_once(actions, indexes)
        except ItemTooLarge:
            if squeeze is None:
                raise
            blobs, updates = squeeze
            if not any([blobs.squeeze(sk, u) for sk, u in updates]):
                raise
            self.transact_once(actions, indexes)

    def transact_once(self, actions: list[tuple[dict[str, Any], int]], indexes: int) -> None:
        items = []
        for action, _ in actions:
            ((kind, body),) = action.items()
            body = dict(body, TableName=self.name)
            if "ConditionExpression" in body:
                body["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            items.append({kind: body})
        for attempt in range(CONFLICT_TRIES):
            try:
                # errors mapped below; each action is as tx_put, tx_update and tx_check built it
                self._db.transact_write_items(TransactItems=cast("list[TransactWriteItemTypeDef]", items))
                break
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                reasons = error.response.get("CancellationReasons") or []
                codes = {r.get("Code") for r in reasons}
                message = " ".join(
                    [error.response.get("Error", {}).get("Message", "")] + [r.get("Message") or "" for r in reasons]
                )
                if (
                    code == "TransactionCanceledException"
                    and codes & _THROTTLED_REASONS
                    and not codes & {"ConditionalCheckFailed"}
                ):
                    raise TransientError(f"DynamoDB throttled a transaction on {self.name}: {message.strip()}") from error
                if code == "TransactionCanceledException" and "ConditionalCheckFailed" in codes:
                    # Cancelled, counted as its writes of the items it found (as a meter would).
                    found = [item_size(cast("Item", dict(r).get("Item") or {})) for r in reasons] + [0] * len(actions)
                    self.count(write=2 * sum(write_units(max(f, size)) for f, (_, size) in zip(found, actions, strict=False)))
                    raise ConditionFailed([dict(r) for r in reasons]) from None
                if (code == "ValidationException" or "ValidationError" in codes) and "size" in message.lower():
                    raise too_large(message, self.bucket) from None
                conflict = code == "TransactionConflictException" or (
                    code == "TransactionCanceledException" and codes <= {"None", "TransactionConflict", None}
                )
                if not conflict:
                    _reraise(error)
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        else:
            raise Conflict("a write kept conflicting with concurrent writes to the same items; try again")
        self.count(write=2 * sum(write_units(size) for _, size in actions) + indexes)

    def tx_put(self, item: Item, condition: str | None = None, e: Expr | None = None) -> tuple[dict[str, Any], int]:
        body: dict[str, Any] = {"Item": item}
        if condition:
            body.update(ConditionExpression=condition, **(e or Expr()).params())
        return {"Put": body}, item_size(item)

    def tx_update(
        self, key: Item, u: Update, condition: str | None = None, *, size: int | None = None
    ) -> tuple[dict[str, Any], int]:
        body: dict[str, Any] = {"Key": key, "UpdateExpression": u.expression(), **u.params()}
        if condition:
            body["ConditionExpression"] = condition
        return {"Update": body}, size if size is not None else item_size(key) + u.payload()

    def tx_check(self, key: Item, e: Expr, condition: str) -> tuple[dict[str, Any], int]:
        return {"ConditionCheck": {"Key": key, "ConditionExpression": condition, **e.params()}}, 1024

    def text(self, av: AttributeValueTypeDef) -> Any:
        """A stored attribute as Python (text, a number, a boolean or None), reading a blob
        from S3 when it is a pointer."""
        value = from_av(av)
        if isinstance(value, dict) and isinstance(value.get("s3"), str):
            bucket, _, key = value["s3"].removeprefix("s3://").partition("/")
            return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        if value is None or isinstance(value, (str, int, float)):
            return value
        raise TypeError(f"unexpected attribute {av!r}")

    def fields(self, item: Item, names: Iterable[str], kept_as: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The named model fields of an item (absent ones left to the model's defaults), each
        under its name in `kept_as` if it has one there (else, or in an item written before,
        its own). `RecordDamaged` naming the item and the field when a JSON field does not
        parse (strictly: a NaN no entrance lets in now is damage too)."""
        out: dict[str, Any] = {}
        for name in names:
            attr = (kept_as or {}).get(name, name)
            if attr not in item:
                attr = name
            if attr in item:
                value = self.text(item[attr])
                if name in JSON_FIELDS:
                    try:
                        value = jsonsafe.parse_stored(value)
                    except (TypeError, ValueError):
                        raise damaged(item_name(item), [name]) from None
                elif name in TIME_FIELDS:
                    value = unpack_time(value)
                out[name] = value
        return out

    def live(self, kind: str, tenant: str | None) -> list[Item]:
        """The items the sparse `live` index names for `kind`, re-read consistently (the
        index lags the table a little): Query for one tenant, Scan of the index for all."""
        if tenant is not None:
            e = Expr()
            keys = self.query(
                index=LIVE_INDEX, KeyConditionExpression=f"{e.n('vpk')} = {e.v(live_pk(tenant, kind))}", **e.params()
            )
        else:
            e = Expr()
            kind_only = f"begins_with({e.n('sk')}, {e.v(LIVE_KINDS[kind])})"
            params: dict[str, Any] = {"IndexName": LIVE_INDEX, "FilterExpression": kind_only, **e.params()}
            keys = []
            while True:
                page = self.request("scan", **params)
                keys += page.get("Items", [])
                self.count(read=0.5 * read_units(sum(item_size(i) for i in page.get("Items", []))))
                if "LastEvaluatedKey" not in page:
                    break
                params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        items = self.batch_get([{"pk": k["pk"], "sk": k["sk"]} for k in keys])
        return [i for i in items if "vpk" in i]

    # -- items ----------------------------------------------------------------------------

    def delete(self, key: Item, *, returns: str = "NONE") -> dict[str, Any] | None:
        """Delete an item if it is there (None if it was not). The caller counts a deletion (it
        knows the item's size); `request` counts a refused one."""
        e = Expr()
        try:
            reply = self.request("delete_item", Key=key, ConditionExpression=e.exists("pk"), ReturnValues=returns, **e.params())
        except ConditionFailed:
            return None
        return reply

    def batch_put(self, items: list[Item]) -> None:
        """Put items 25 at a time (no conditions), retrying what DynamoDB leaves unprocessed."""
        for start in range(0, len(items), 25):
            pending: dict[str, Any] = {self.name: [{"PutRequest": {"Item": i}} for i in items[start : start + 25]]}
            for attempt in range(UNPROCESSED_TRIES):
                reply = self._client_call(self._db.batch_write_item, RequestItems=pending)
                pending = reply.get("UnprocessedItems") or {}
                if not pending:
                    break
                time.sleep(min(1.0, 0.01 * 2**attempt))
            else:
                raise TransientError(f"DynamoDB kept leaving items of {self.name} unprocessed; try again")
            self.count(write=sum(write_units(item_size(i)) for i in items[start : start + 25]))

    def close(self) -> None:
        self._db.close()
        self._s3.close()


def _reraise(error: ClientError) -> NoReturn:
    """Raise a throttle as `TransientError` (chained to it), anything else as it came."""
    wrapped = transient(error)
    if wrapped is None:
        raise error
    raise wrapped from error
