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
| note            | T#<tenant>#R#<run> | N#<note id>                | to, st (a question's status), body (the |
|                 |                    |                            | Note's JSON); an open question is live  |
| observed        | T#<tenant>#R#<run> | O#<idx>#<n>#<seq>          | ids (JSON): notes attempt n observed    |

What a step's attempts write lives on the step item, so each write of a step's happy path
is one conditional write of one item, and the item is kept small, since DynamoDB bills every
write of it by its whole size, names included, per started KB (a completed stub step is
~960 bytes, one unit a write): fields that no key, condition, filter or projection names are
kept under short names (STEP_SHORT: `m` message, `r` result, `c` conclusion, `f` finished_at,
...), fields at their defaults are left out (STEP_DEFAULTS), and the times of attempts, journal
entries, spans and `finished_at` are epoch milliseconds where they are ours (pack_time). An
item written before keeps the fields' own names and texts, which reads still accept.
- `A<n>`: attempt n, a map (t token, s started_at, r resumed_at, st status, e ended_at,
  why reason, k reason_kind, w worker, hb heartbeat_at, op op_id). `live_n` names the running one (a claim
  needs it absent); `last_n` keeps attempt numbers from ever repeating. A step keeps its
  latest ATTEMPTS_ON_STEP; a claim that would keep more first copies the oldest to `A#`
  items (an ended attempt never changes again, so a copy is never stale).
- `J<sha(op_id)>`: the claim journal's entries of the step, a map (s status, c created_at,
  x expires_at; op while pending, n once completed); `jp` counts the pending ones. A
  claim drops settled entries past their expiry (what TTL did) and moves those past
  JOURNAL_ON_STEP to `J#` items (`jm` counts them), so the item never grows with time.
  An op_id names one step: `journal_settle`, which is not told which, finds it with a
  filtered Query of the run's steps.
- `layers`: the step's prompt layers, `[name, chars, sha256]` each and a 1 when dynamic
  (created with, replaced by a claim's or `set_prompt_layers`).
- `calls`: spans by id, a map of at most CALLS_ON_STEP spans of at most CALL_INLINE_MAX
  bytes each, each its fields but the id and those at their defaults (span_text); other
  spans are items of their own. The map wins over an item of the same id,
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
status running and `live_n = n`. Heartbeat, prompt layers and spans that fit are single
updates of the step item too; an event (an item of its own) is a TransactWriteItems of a
ConditionCheck on the step item and the put. Transactions are left for what one item
cannot carry: spans the step cannot keep (+ their items), `create_run`, `add_steps`. A
refused write changed nothing; the rule book (laneflow.adapters.store.rulebook) turns it
into the domain's error (`Conflict`, `AttemptEnded`, `RunNotFound`, `NotFound`). Where a
write's cheap form depends on what the item holds (room for spans, other pending journal
entries), it is conditional on that too, and a refusal that found the attempt still
running is retried in the form the item it found calls for. Costs are kept as decimals
rounded to 6 places. A throttle (or a DynamoDB failure) that outlasts the client's own
retries is `TransientError`, which the state machine retries by name.

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
large items. moto reports no real capacity, so the count is the store's own; a meter
outside the store (laneflow_dev.capacity, on `client`) checks it in bench/store_cost.py and
the tests, from the items before and after each request.

Modules: this one (the store: what each primitive of runs, steps, attempts, the journal
and the trace reads and writes), dynamodb_inbox.py (handoffs, warm gates, inboxes),
dynamodb_schedules.py (schedules and the runs their firings started),
dynamodb_steps.py (the step item's claims, journal entries and fenced writes),
dynamodb_spans.py (spans, and items written under a fence), dynamodb_table.py (requests,
the live index, capacity, errors), dynamodb_items.py (keys, values, sizes),
dynamodb_expr.py (expressions), dynamodb_blobs.py (large values in S3).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

from laneflow.adapters.store.dynamodb_blobs import ItemTooLarge
from laneflow.adapters.store.dynamodb_expr import Expr, Update, step_filter
from laneflow.adapters.store.dynamodb_inbox import DynamoGatesAndInboxes
from laneflow.adapters.store.dynamodb_items import (
    ACTIVE_RUN,
    ATTEMPTS_ON_STEP,
    BLOB_THRESHOLD,
    BY_TENANT_INDEX,
    CALLS_ON_STEP,
    INPUT_SK,
    JOURNAL_ON_STEP,
    RUN_BODY,
    RUN_HEAD,
    RUN_SK,
    SEQUENCE,
    STEP_ATTRS,
    STEP_ATTRS_WITHOUT_MESSAGE,
    STEP_SHORT,
    STEPS_END,
    TRANSACTION_BYTES,
    TRANSACTION_ITEMS,
    decimal_cost,
    encode,
    event_sk,
    first_of,
    item_name,
    item_size,
    key_of,
    live_pk,
    pk_of,
    read_units,
    runs_pk,
    set_step_field,
    step_attr,
    step_name,
    step_sk,
    to_attr,
    trace_prefix,
)
from laneflow.adapters.store.dynamodb_prefixes import DynamoPrefixes
from laneflow.adapters.store.dynamodb_schedules import DynamoSchedules
from laneflow.adapters.store.dynamodb_steps import StepItems
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.encoding import dumps
from laneflow.adapters.store.primitives import AttemptWrite, Claim, Doc, Refused, RunPart, StepState
from laneflow.adapters.store.rulebook import RuleBookStore
from laneflow.adapters.store.rulebook_base import trace_damaged
from laneflow.domain.errors import InvalidInput, RecordDamaged
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    Event,
    JournalEntry,
    JournalStatus,
    Run,
    Step,
)

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

    from laneflow.adapters.store.dynamodb_items import Item

log = logging.getLogger("laneflow.store")

__all__ = ["ATTEMPTS_ON_STEP", "BLOB_THRESHOLD", "CALLS_ON_STEP", "JOURNAL_ON_STEP", "DynamoStore", "ItemTooLarge"]

_SESSION_LOCK = threading.Lock()


@cache
def _shared_session() -> boto3.session.Session:
    """One boto3 session per process, so every store's clients share its parsed service
    models (a session per store parses them again: ~100 ms a store)."""
    return boto3.session.Session()


class DynamoStore(DynamoGatesAndInboxes, DynamoPrefixes, DynamoSchedules, RuleBookStore):
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
        self._table = Table(self._db, self._s3, table, bucket, blob_threshold)
        self._items = StepItems(self._table)
        self.table = table
        self.bucket = bucket
        self.region = region
        self.blob_threshold = blob_threshold
        query = "&".join(f"{k}={v}" for k, v in (("bucket", bucket), ("region", region)) if v)
        self.url = f"dynamodb://{table}" + (f"?{query}" if query else "")

    def __repr__(self) -> str:
        return f"DynamoStore({self.table!r}, bucket={self.bucket!r}, region={self.region!r})"

    def close(self) -> None:
        self._table.close()

    @property
    def client(self) -> DynamoDBClient:
        """The DynamoDB client every request of this store goes through (what a meter outside
        the store watches)."""
        return self._db

    def operation_now(self) -> str:
        """The public method this thread is inside now, as `consumed()` counts it ("other"
        outside one)."""
        return self._table.current_operation()

    def consumed(self, *, reset: bool = False) -> dict[str, dict[str, float]]:
        """Capacity units by operation since the store was opened (or last reset):
        {"read": {op: RCU}, "write": {op: WCU}, "requests": {op: count}}."""
        return self._table.meter.snapshot(reset)

    @contextmanager
    def _operation(self, name: str) -> Iterator[None]:
        with self._table.operation(name):
            yield

    # -- items ----------------------------------------------------------------------------

    @staticmethod
    def _attrs(model: Any, fields: Iterable[str]) -> dict[str, Any]:
        return {f: v for f in fields if (v := to_attr(f, getattr(model, f))) is not None}

    def _run_of(
        self, head: dict[str, Any], body: dict[str, Any] | None, steps: list[dict[str, Any]] | None = None, *, input: bool = True
    ) -> Doc:
        fields = self._table.fields(head, RUN_HEAD)
        if body is not None:  # without `input`, its input is neither decoded nor fetched (a large one is in S3)
            fields.update(self._table.fields(body, RUN_BODY if input else tuple(f for f in RUN_BODY if f != "input")))
        return {**fields, "steps": steps or []}

    def _step_of(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._table.fields(item, STEP_ATTRS, STEP_SHORT)

    def _head(self, tenant: str, run_id: str) -> Item | None:
        head = self._table.get(key_of(tenant, run_id, RUN_SK))
        return None if head is None or "hidden" in head else head

    def _runs(self, pks: list[str]) -> list[tuple[str, Doc | RecordDamaged]]:
        """(id, run) of these partition keys, in this order (those gone or hidden left out)."""
        items = self._table.batch_get([{"pk": {"S": pk}, "sk": {"S": sk}} for pk in pks for sk in (RUN_SK, INPUT_SK)])
        found = {(i["pk"]["S"], i["sk"]["S"]): i for i in items}
        out: list[tuple[str, Doc | RecordDamaged]] = []
        for pk in pks:
            head = found.get((pk, RUN_SK))
            if head is not None and "hidden" not in head:
                run_id = pk.partition("#R#")[2]
                try:
                    out.append((run_id, self._run_of(head, found.get((pk, INPUT_SK)))))
                except RecordDamaged as damaged:
                    out.append((run_id, damaged))
        return out

    # == primitives: reads ==============================================================

    def _read_run(
        self, tenant: str, run_id: str, *, steps: bool = False, detail: bool = False, part: RunPart = "whole"
    ) -> Doc | None:
        if part == "key":
            return None if self._head(tenant, run_id) is None else {}
        pk = pk_of(tenant, run_id)
        if not steps:  # the run's head and its body
            items = self._table.query_prefix(pk, RUN_SK)
        else:
            items = self._table.query_range(pk, RUN_SK, None if detail else STEPS_END)
        by_sk = {item["sk"]["S"]: item for item in items}
        head, body = by_sk.get(RUN_SK), by_sk.get(INPUT_SK)
        if head is None or "hidden" in head:
            return None
        if part == "input":
            return self._table.fields(body, ("input",)) if body is not None else {}
        raw = {int(item["index"]["N"]): item for sk, item in by_sk.items() if sk.startswith("S#")}
        step_items = {index: self._step_of(item) for index, item in raw.items()}
        if detail:
            try:
                self._items.with_trace(step_items, raw, [item for sk, item in by_sk.items() if sk.startswith("T#")])
            except (KeyError, TypeError, ValueError):
                raise trace_damaged(f"run {run_id!r}") from None
        return self._run_of(head, body, [step_items[i] for i in sorted(step_items)], input=part == "whole")

    def _read_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        index: int | None = None,
        group: int | None = None,
        detail: bool = False,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[tuple[int, Doc]]:
        if index is not None:
            item = self._table.get(key_of(tenant, run_id, step_sk(index)))
            if item is None:
                return []
            step = self._step_of(item)
            if detail:
                try:
                    self._items.with_trace(
                        {index: step}, {index: item}, self._table.query_prefix(pk_of(tenant, run_id), trace_prefix(index))
                    )
                except (KeyError, TypeError, ValueError):
                    raise trace_damaged(item_name(item)) from None
            return [(index, step)]
        e = Expr()
        low = step_sk(where.low) if where is not None and where.low is not None else "S#"
        high = step_sk(where.high) if where is not None and where.high is not None else STEPS_END
        steps = f"{e.n('pk')} = {e.v(pk_of(tenant, run_id))} AND {e.n('sk')} BETWEEN {e.v(low)} AND {e.v(high)}"
        params: dict[str, Any] = {"KeyConditionExpression": steps}
        kept = step_filter(e, group, where)
        if kept:
            params["FilterExpression"] = " AND ".join(kept)
        attrs = STEP_ATTRS if messages else STEP_ATTRS_WITHOUT_MESSAGE  # a message kept in S3 is not fetched
        items = self._table.query(**params, **e.params())
        if where is not None:  # the lanes' first few and the limit are counted here, in index order
            items = first_of(items, where)
        return [(int(i["index"]["N"]), self._table.fields(i, attrs, STEP_SHORT)) for i in items]

    def _read_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        return self._items.outline(tenant, run_id)

    def _read_attempts(self, tenant: str, run_id: str, *, index: int | None = None, n: int | None = None) -> list[Attempt] | None:
        return self._items.attempts(tenant, run_id, index, n)

    def _read_step_state(self, tenant: str, run_id: str, index: int | None, op_id: str | None) -> StepState | None:
        return self._items.state(tenant, run_id, index, op_id)

    def _list_runs(
        self, tenant: str, limit: int, statuses: list[str] | None, before: str | None = None
    ) -> list[tuple[str, Doc | RecordDamaged]] | None:
        e = Expr()
        key = f"{e.n('lpk')} = {e.v(runs_pk(tenant))}"
        if before is not None:  # after that run in the index's order: its `lsk` and below
            head = self._head(tenant, before)
            if head is None:
                return None
            key += f" AND {e.n('lsk')} < {e.v(head['lsk']['S'])}"
        params: dict[str, Any] = {
            "KeyConditionExpression": key,
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if statuses is not None:
            params["FilterExpression"] = e.one_of("status", sorted(statuses))
        params.update(e.params())
        keys: list[tuple[str, str]] = []
        while len(keys) < limit:
            page = self._table.request("query", IndexName=BY_TENANT_INDEX, **params)
            self._table.count(read=0.5 * read_units(sum(item_size(i) for i in page.get("Items", []))))
            keys += [(i["pk"]["S"], i["lsk"]["S"]) for i in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        rows = self._runs([pk for pk, _ in keys[:limit]])
        # The index projects the status a run had; what is read decides.
        return [
            (run_id, doc)
            for run_id, doc in rows
            if statuses is None or not isinstance(doc, dict) or doc.get("status") in statuses
        ]

    def _active_runs(self, tenant: str | None) -> list[tuple[str, Doc | RecordDamaged]]:
        heads = [i for i in self._table.live("RUN", tenant) if i.get("status", {}).get("S") in ACTIVE_RUN and "hidden" not in i]
        heads.sort(key=lambda i: i["vsk"]["S"])
        return self._runs([i["pk"]["S"] for i in heads])

    def _running_attempts(self, tenant: str | None) -> list[tuple[str, Attempt]]:
        return self._items.running(self._table.live("STEP", tenant))

    def _pending_entries(self, tenant: str | None) -> list[JournalEntry]:
        return self._items.pending(self._table.live("STEP", tenant))

    # == primitives: writes =============================================================

    def _insert_run(self, run: Run) -> None:
        pk = pk_of(run.tenant, run.id)
        seq = f"{run.created_at}#{SEQUENCE.next()}"
        head = {"pk": pk, "sk": RUN_SK, **self._attrs(run, RUN_HEAD), "lpk": runs_pk(run.tenant), "lsk": seq, "vsk": seq}
        if run.status.value in ACTIVE_RUN:
            head["vpk"] = live_pk(run.tenant, "RUN")
        with self._table.blobs(run.tenant, run.id) as blobs:
            head = blobs.item(head)
            rest = [blobs.item({"pk": pk, "sk": INPUT_SK, **{f: dumps(getattr(run, f)) for f in RUN_BODY}})]
            for step in run.steps:
                rest += self._items.step_items(blobs, run.tenant, run.id, step)
            indexes = 1 + ("vpk" in head)
            e = Expr()
            new = e.absent("pk")
            items = [encode(head)] + [encode(i) for i in rest]
            if len(items) <= TRANSACTION_ITEMS and sum(item_size(i) for i in items) <= TRANSACTION_BYTES:
                try:
                    self._table.transact(
                        [self._table.tx_put(items[0], new, e)] + [self._table.tx_put(i) for i in items[1:]], indexes=indexes
                    )
                except ConditionFailed:
                    raise Refused() from None
                return
            self._create_large(run, head, items[1:], indexes)

    def _create_large(self, run: Run, head: dict[str, Any], rest: list[dict[str, Any]], indexes: int) -> None:
        """More than one transaction holds: write the run hidden (its id taken, reading as
        absent), then its items, then reveal it in one update."""
        reveal = Update()
        hidden = dict(head, hidden=True)
        for name in ("lpk", "vpk"):
            if name in hidden:
                reveal.set(name, hidden.pop(name))
        reveal.remove("hidden")
        e = Expr()
        try:
            self._table.put(encode(hidden), e.absent("pk"), e)
        except ConditionFailed:
            raise Refused() from None
        self._table.batch_put(rest)
        self._table.update(key_of(run.tenant, run.id, RUN_SK), reveal, indexes=indexes)

    def _insert_steps(self, tenant: str, run_id: str, steps: list[Step]) -> bool:
        with self._table.blobs(tenant, run_id) as blobs:
            items = [encode(i) for step in steps for i in self._items.step_items(blobs, tenant, run_id, step)]
            if len(items) + 1 > TRANSACTION_ITEMS:
                raise ValueError(
                    f"add_steps writes at most {TRANSACTION_ITEMS - 1} items at once (steps with their trace); got {len(items)}"
                )
            run = Expr()
            actions = [
                self._table.tx_check(key_of(tenant, run_id, RUN_SK), run, f"{run.exists('pk')} AND {run.absent('hidden')}")
            ]
            for item in items:
                if item["sk"]["S"].startswith("S#"):
                    e = Expr()
                    actions.append(self._table.tx_put(item, e.absent("pk"), e))
                else:
                    actions.append(self._table.tx_put(item))
            try:
                self._table.transact(actions)
            except ConditionFailed as refused:
                if refused.failed(0):
                    return False
                raise Refused() from None
        return True

    def _update_run(
        self,
        tenant: str,
        run_id: str,
        values: dict[str, Any],
        *,
        expected: list[str] | None,
        add_drives: int = 0,
        unset: str | None = None,
    ) -> Doc:
        key = key_of(tenant, run_id, RUN_SK)
        u = Update()
        with self._table.blobs(tenant, run_id) as blobs:
            for field, value in blobs.attrs(RUN_SK, {f: to_attr(f, v) for f, v in values.items()}).items():
                u.set(field, value)
            if add_drives:
                u.add("drives", int(add_drives))
            indexes = 0
            if "status" in values:
                status = values["status"].value
                active = status in ACTIVE_RUN
                u.set("vpk", live_pk(tenant, "RUN") if active else None)
                # The status the by-tenant index projects, and the live entry, each where it may
                # change from a status expected (a run started, queued to running, stays live).
                indexes = 2
                if expected is not None:
                    indexes = int(any(s != status for s in expected)) + int(any((s in ACTIVE_RUN) != active for s in expected))
            condition = [u.exists("pk"), u.absent("hidden")]
            if expected is not None:
                condition.append(u.one_of("status", expected))
            if unset is not None:
                condition.append(f"{u.n(unset)} <> {u.v(True)}")
            try:
                head = self._table.update(key, u, " AND ".join(condition), returns="ALL_NEW", indexes=indexes, blobs=blobs)
            except ConditionFailed as refused:
                found = refused.found(0)
                raise Refused(None if found is None or "hidden" in found else found["status"]["S"]) from None
        return self._run_of(head, self._table.get(key_of(tenant, run_id, INPUT_SK)))  # type: ignore[arg-type]

    def _add_run_cost(self, tenant: str, run_id: str, usd: float, *, expected: list[str]) -> float:
        # An ADD on the run's head item: DynamoDB adds numbers exactly, and concurrent adds
        # never lose one another (no read, no transaction on a run's hottest item).
        u = Update().add("cost_usd", decimal_cost(usd))
        condition = " AND ".join([u.exists("pk"), u.absent("hidden"), u.one_of("status", expected)])
        try:
            head = self._table.update(key_of(tenant, run_id, RUN_SK), u, condition, returns="ALL_NEW")
        except ConditionFailed as refused:
            found = refused.found(0)
            raise Refused(None if found is None or "hidden" in found else found["status"]["S"]) from None
        return float((head or {}).get("cost_usd", {}).get("N", usd))

    def _update_step(self, tenant: str, run_id: str, index: int, values: dict[str, Any], *, expected: list[str] | None) -> Doc:
        u = Update()
        with self._table.blobs(tenant, run_id) as blobs:
            changes = blobs.attrs(step_sk(index), {step_name(f): step_attr(f, v) for f, v in values.items()})
            for field in values:
                set_step_field(u, field, changes[step_name(field)])
            condition = [u.exists("pk")]
            if expected is not None:
                condition.append(u.one_of("status", expected))
            try:
                item = self._table.update(
                    key_of(tenant, run_id, step_sk(index)), u, " AND ".join(condition), returns="ALL_NEW", blobs=blobs
                )
            except ConditionFailed as refused:
                found = refused.found(0)
                raise Refused(None if found is None else found["status"]["S"]) from None
        return self._step_of(item)  # type: ignore[arg-type]

    def _write_claim(self, tenant: str, run_id: str, claim: Claim, seen: StepState) -> None:
        self._items.claim(tenant, run_id, claim, seen)

    def _write_entry(self, entry: JournalEntry, seen: StepState | None) -> None:
        if entry.status == JournalStatus.pending:
            self._items.begin_entry(entry, seen)
        else:
            assert seen is not None, "an entry is settled as it was seen"
            self._items.settle_entry(entry, seen)

    def _write_attempt(self, ref: AttemptRef, write: AttemptWrite) -> None:
        self._items.write_attempt(ref, write)

    def _append(self, tenant: str, run_id: str, index: int, line: Event | list[str], fence: AttemptRef | None) -> None:
        if not isinstance(line, Event):
            assert fence is not None, "observed ids are an attempt's"
            self._items.fenced_put(fence, self._observed_item(fence, line))
            return
        with self._table.blobs(tenant, run_id) as blobs:
            attrs = {
                "pk": pk_of(tenant, run_id),
                "sk": event_sk(index, SEQUENCE.next()),
                **self._items.event_attrs(line, line.attempt),
            }
            item = encode(blobs.item(attrs))
            if fence is None:
                self._table.put(item)
            else:
                self._items.fenced_put(fence, item)
