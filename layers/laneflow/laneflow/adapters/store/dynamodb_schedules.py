"""The DynamoDB store's schedules, in the store's one table:

| item         | pk                         | sk                  | holds                               |
|--------------|----------------------------|---------------------|-------------------------------------|
| schedule     | T#<tenant>#SCHEDULES       | SCHEDULE#<id>       | v (version), body (the record JSON) |
| schedule run | T#<tenant>#SCHEDULE#<id>   | RUN#<scheduled at>  | run (the run the firing started)    |

A tenant's schedules are one partition (a Query lists them; a tenant has tens, not
millions). An enabled schedule is live (`vpk` `T#<tenant>#LIVE#SCHED`), so `serve` finds
what to fire for every tenant from the sparse index, never by a scan of the table; pausing
removes it from the index in the same write. Every write of a record is conditional on the
version read. The runs a schedule started are items of their own, newest last by sort key,
so listing them is a Query of one partition, however many the schedule has started."""

from __future__ import annotations

from typing import Any

from laneflow.adapters.store.dynamodb_expr import Expr
from laneflow.adapters.store.dynamodb_items import SCHEDULE_PREFIX, encode, item_size, live_pk, read_units
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.primitives import Refused
from laneflow.domain.schedules import Schedule, ScheduleState
from laneflow.domain.tenants import check_tenant

RUN_PREFIX = "RUN#"


def schedules_pk(tenant: str) -> str:
    return f"T#{check_tenant(tenant)}#SCHEDULES"


def schedule_key(tenant: str, schedule_id: str) -> dict[str, Any]:
    return {"pk": {"S": schedules_pk(tenant)}, "sk": {"S": SCHEDULE_PREFIX + schedule_id}}


def schedule_runs_pk(tenant: str, schedule_id: str) -> str:
    return f"T#{check_tenant(tenant)}#SCHEDULE#{schedule_id}"


class DynamoSchedules:
    """The primitives of schedules, over the store's table."""

    _table: Table

    def _read_schedule(self, tenant: str, schedule_id: str) -> str | None:
        item = self._table.get(schedule_key(tenant, schedule_id))
        return None if item is None else str(item["body"]["S"])

    def _schedule_docs(self, tenant: str | None, *, enabled_only: bool) -> list[tuple[str, str]]:
        if enabled_only:
            items = self._table.live("SCHED", tenant)
        else:
            assert tenant is not None  # every schedule of every tenant is never listed
            items = self._table.query_prefix(schedules_pk(tenant), SCHEDULE_PREFIX)
        return [(i["sk"]["S"].removeprefix(SCHEDULE_PREFIX), str(i["body"]["S"])) for i in items]

    def _write_schedule(self, schedule: Schedule, *, expected: int | None) -> None:
        attrs: dict[str, Any] = {"v": schedule.version, "body": schedule.model_dump_json()}
        if schedule.state == ScheduleState.enabled:
            attrs["vpk"], attrs["vsk"] = live_pk(schedule.tenant, "SCHED"), f"{schedule.created_at}#{schedule.id}"
        item = {**schedule_key(schedule.tenant, schedule.id), **encode(attrs)}
        e = Expr()
        condition = e.absent("pk") if expected is None else e.eq("v", expected)
        try:
            self._table.put(item, condition, e, indexes=int("vpk" in item))
        except ConditionFailed:
            raise Refused() from None

    def _delete_schedule(self, tenant: str, schedule_id: str, *, expected: int) -> None:
        e = Expr()
        try:
            self._table.request(
                "delete_item", Key=schedule_key(tenant, schedule_id), ConditionExpression=e.eq("v", expected), **e.params()
            )
        except ConditionFailed:
            raise Refused() from None
        self._table.count(write=2)  # the item and its index entry, at most

    def _put_schedule_run(self, tenant: str, schedule_id: str, scheduled_at: str, run_id: str) -> None:
        item = encode({"pk": schedule_runs_pk(tenant, schedule_id), "sk": RUN_PREFIX + scheduled_at, "run": run_id})
        self._table.put(item)

    def _schedule_runs(self, tenant: str, schedule_id: str, limit: int, before: str | None) -> list[tuple[str, str]]:
        e = Expr()
        sk = e.n("sk")
        key = f"{e.n('pk')} = {e.v(schedule_runs_pk(tenant, schedule_id))} AND "
        # BETWEEN takes its bounds in: `before` itself is read, and left out below.
        key += (
            f"{sk} BETWEEN {e.v(RUN_PREFIX)} AND {e.v(RUN_PREFIX + before)}"
            if before
            else f"begins_with({sk}, {e.v(RUN_PREFIX)})"
        )
        page = self._table.request(
            "query", KeyConditionExpression=key, ScanIndexForward=False, Limit=limit + 1, ConsistentRead=True, **e.params()
        )
        items = page.get("Items", [])
        self._table.count(read=read_units(sum(item_size(i) for i in items)))
        rows = [(i["sk"]["S"].removeprefix(RUN_PREFIX), str(i["run"]["S"])) for i in items]
        return [(at, run_id) for at, run_id in rows if before is None or at < before][:limit]
