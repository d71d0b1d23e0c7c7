"""The DynamoDB store's prefix registry: one item per tenant and prefix key (`pk`
`T#<tenant>#P#<key>`, `sk` `PREFIX`), the record as JSON and its version the condition of
every write. A record with a writer is live (the sparse index), so reconcile finds the
claims to look at without a scan of the table."""

from __future__ import annotations

from typing import Any

from laneflow.adapters.store.dynamodb_expr import Expr
from laneflow.adapters.store.dynamodb_items import PREFIX_SK, encode, live_pk
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.primitives import Refused
from laneflow.domain.prefixes import PrefixRecord
from laneflow.domain.tenants import check_tenant


def prefix_key_of(tenant: str, key: str) -> dict[str, Any]:
    return {"pk": {"S": f"T#{check_tenant(tenant)}#P#{key}"}, "sk": {"S": PREFIX_SK}}


class DynamoPrefixes:
    """The primitives of the prefix registry, over the store's table."""

    _table: Table

    def _read_prefix(self, tenant: str, key: str) -> PrefixRecord | None:
        item = self._table.get(prefix_key_of(tenant, key))
        return None if item is None else PrefixRecord.model_validate_json(item["body"]["S"])

    def _write_prefix(self, tenant: str, record: PrefixRecord, *, expected: int | None) -> None:
        attrs: dict[str, Any] = {"v": record.version, "body": record.model_dump_json()}
        if record.writer is not None:
            attrs["vpk"], attrs["vsk"] = live_pk(tenant, "PFX"), record.key
        item = {**prefix_key_of(tenant, record.key), **encode(attrs)}
        e = Expr()
        condition = e.absent("pk") if expected is None else e.eq("v", expected)
        try:
            self._table.put(item, condition, e, indexes=int("vpk" in item))
        except ConditionFailed:
            raise Refused() from None

    def _writing_prefixes(self, tenant: str | None) -> list[tuple[str, PrefixRecord]]:
        found = []
        for item in self._table.live("PFX", tenant):
            owner = item["pk"]["S"].split("#")[1]
            found.append((owner, PrefixRecord.model_validate_json(item["body"]["S"])))
        return found
