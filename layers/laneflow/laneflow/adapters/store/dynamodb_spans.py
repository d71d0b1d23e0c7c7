"""The DynamoDB store's spans of a step's attempts (model calls: into the step item's `calls`
map while it has room, else items of their own) and the items written beside a step item
under its attempt's fence, in transactions (see laneflow.adapters.store.dynamodb)."""

from __future__ import annotations

import json
from typing import Any

from laneflow.adapters.store.dynamodb_blobs import Blobs
from laneflow.adapters.store.dynamodb_expr import Expr, Update, fence_condition
from laneflow.adapters.store.dynamodb_items import (
    CALL_INLINE_MAX,
    CALLS_ON_STEP,
    TRANSACTION_BYTES,
    TRANSACTION_ITEMS,
    call_sk,
    encode,
    item_size,
    key_of,
    pk_of,
    record_of,
    span_text,
    step_sk,
    time_of,
)
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.primitives import Fenced, Refused
from laneflow.domain.records import Attempt, AttemptRef, AttemptStatus, ModelCall


class StepSpans:
    """Spans and fenced items of step items, over one table."""

    table: Table

    def fenced(self, ref: AttemptRef, found: dict[str, Any] | None) -> Fenced:
        """What a refused fenced write found on the step item."""
        record = record_of(found, ref.n)
        last_n = int(found["last_n"]["N"]) if found is not None and "last_n" in found else 0
        if record is None:
            return Fenced(None, last_n)
        identity = {"token": record.get("t", {}).get("S", ""), "started_at": time_of(record.get("s")) or ""}
        stored = Attempt(
            run_id=ref.run_id,
            index=ref.index,
            n=ref.n,
            resumed_at=time_of(record.get("r")),
            status=record.get("st", {}).get("S", AttemptStatus.running.value),
            **identity,
        )
        return Fenced(stored, last_n)

    def _fenced_transact(
        self,
        ref: AttemptRef,
        key: dict[str, Any],
        u: Update,
        condition: str,
        puts: list[dict[str, Any]],
        indexes: int,
        blobs: Blobs,
        size: int,
    ) -> None:
        """The step item's fenced update (or a ConditionCheck, when it changes nothing) and
        span items, in one transaction. Spans past what one transaction holds (an attempt of
        hundreds of turns) are put first, each batch fenced on its own."""
        step = (
            self.table.tx_update(key, u, condition, size=size + u.payload() if size else None)
            if u
            else self.table.tx_check(key, u, condition)
        )
        actions = [step]
        batches: list[list[dict[str, Any]]] = [[]]
        for item in reversed(puts):  # the last batch goes with the write itself
            limit = TRANSACTION_ITEMS - (len(actions) if len(batches) == 1 else 1)
            if len(batches[-1]) >= limit or sum(map(item_size, batches[-1])) + item_size(item) > TRANSACTION_BYTES // 2:
                batches.append([])
            batches[-1].append(item)
        for batch in reversed(batches[1:]):
            e = Expr()
            self.table.transact([self.table.tx_check(key, e, fence_condition(e, ref))] + [self.table.tx_put(i) for i in batch])
        self.table.transact(
            actions + [self.table.tx_put(i) for i in batches[0]], indexes=indexes, squeeze=(blobs, [(key["sk"]["S"], u)])
        )

    def _span_bodies(self, blobs: Blobs, ref: AttemptRef, calls: list[ModelCall]) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """Spans by id (a later one of the same id wins): the body, and the item of one too
        large to keep in the step item."""
        spans: dict[str, tuple[str, dict[str, Any] | None]] = {}
        for call in calls:
            body = span_text(call)
            item = None
            if len(body.encode()) > CALL_INLINE_MAX:
                span = {"pk": pk_of(ref.tenant, ref.run_id), "sk": call_sk(ref.index, call.id), "n": call.n, "body": body}
                item = encode(blobs.item(span))
            spans[call.id] = (body, item)
        return spans

    def _place_spans(
        self,
        ref: AttemptRef,
        u: Update,
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
            return self._place_spans_blind(u, condition, spans, small, large)
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
        return self._span_items(ref, spans, out)

    @staticmethod
    def _place_spans_blind(
        u: Update,
        condition: list[str],
        spans: dict[str, tuple[str, dict[str, Any] | None]],
        small: list[str],
        large: list[str],
    ) -> list[dict[str, Any]]:
        """The cheap form of `_place_spans`: every small span into the map, conditional on its room."""
        if small:
            condition.append(f"({u.exists('calls')} AND size({u.n('calls')}) <= {u.v(CALLS_ON_STEP - len(small))})")
        for i in small:
            u.set(("calls", i), spans[i][0])
        condition += [u.absent(("calls", i)) for i in large]  # else the map's older version would win
        return [spans[i][1] for i in large]  # type: ignore[misc]

    def _span_items(
        self, ref: AttemptRef, spans: dict[str, tuple[str, dict[str, Any] | None]], out: list[str]
    ) -> list[dict[str, Any]]:
        """The items for the spans that do not go into the step item's map."""
        overflow = [i for i in out if spans[i][1] is None]
        stored = self._stored_spans(ref) if overflow else {}
        items = []
        for i in out:
            body, item = spans[i]
            if item is None:
                if stored.get(i) == body:
                    continue  # kept as it is already (the spans an attempt wrote as it went, written again with its end)
                item = encode(
                    {
                        "pk": pk_of(ref.tenant, ref.run_id),
                        "sk": call_sk(ref.index, i),
                        "n": json.loads(body).get("n", 1),
                        "body": body,
                    }
                )
            items.append(item)
        return items

    def _stored_spans(self, ref: AttemptRef) -> dict[str, str]:
        """The bodies of a step's span items, by id (those kept in S3 left out)."""
        prefix = call_sk(ref.index, "")
        items = self.table.query_prefix(pk_of(ref.tenant, ref.run_id), prefix)
        return {i["sk"]["S"][len(prefix) :]: i["body"]["S"] for i in items if "S" in i["body"]}

    def fenced_put(self, ref: AttemptRef, item: dict[str, Any]) -> None:
        """Put an item only while `ref` is the stored, running attempt: one transaction of a
        ConditionCheck on the step item and the put."""
        e = Expr()
        check = self.table.tx_check(key_of(ref.tenant, ref.run_id, step_sk(ref.index)), e, fence_condition(e, ref))
        try:
            self.table.transact([check, self.table.tx_put(item)])
        except ConditionFailed as refused:
            raise Refused(self.fenced(ref, refused.found(0))) from None
