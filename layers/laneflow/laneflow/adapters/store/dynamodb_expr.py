"""DynamoDB expressions as the store builds them: names aliased, values typed, and the
fence every write about an attempt is conditional on."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from laneflow.adapters.store.dynamodb_items import attempt_attr, av_size, pack_time, record_of, time_of, to_av
from laneflow.domain.outline import StepFilter
from laneflow.domain.records import AttemptRef, AttemptStatus

if TYPE_CHECKING:
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")


class Expr:
    """The names and values of one request's expressions. Every name is aliased: many of
    ours (status, index, group, data, token, text) are DynamoDB reserved words."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, AttributeValueTypeDef] = {}
        self._aliases: dict[str, str] = {}  # names an alias cannot spell (span ids) -> #_<k>

    def n(self, name: str) -> str:
        if PLAIN_NAME.fullmatch(name):
            alias = f"#{name}"
        else:
            alias = self._aliases.setdefault(name, f"#_{len(self._aliases)}")
        self.names[alias] = name
        return alias

    def p(self, path: str | tuple[str, ...]) -> str:
        """An attribute, or a path into a map attribute given as a tuple of names."""
        return self.n(path) if isinstance(path, str) else ".".join(self.n(part) for part in path)

    def v(self, value: Any) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = to_av(value)
        return alias

    def exists(self, name: str | tuple[str, ...]) -> str:
        return f"attribute_exists({self.p(name)})"

    def absent(self, name: str | tuple[str, ...]) -> str:
        return f"attribute_not_exists({self.p(name)})"

    def eq(self, name: str | tuple[str, ...], value: Any) -> str:
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
        return sum(len(v.encode()) for v in self.names.values()) + sum(av_size(v) for v in self.values.values())


class Update(Expr):
    """An UpdateExpression built by naming what to set, add and remove."""

    def __init__(self) -> None:
        super().__init__()
        self._set: list[str] = []
        self._add: list[str] = []
        self._remove: list[str] = []
        self.assigned: dict[str, str] = {}  # value alias -> the attribute it is set to

    def set(self, name: str | tuple[str, ...], value: Any) -> Update:
        if value is None:
            return self.remove(name)
        alias = self.v(value)
        self.assigned[alias] = name if isinstance(name, str) else name[-1]
        self._set.append(f"{self.p(name)} = {alias}")
        return self

    def set_default(self, name: str, value: Any) -> Update:
        alias = self.n(name)
        self._set.append(f"{alias} = if_not_exists({alias}, {self.v(value)})")
        return self

    def add(self, name: str, value: Any) -> Update:
        self._add.append(f"{self.n(name)} {self.v(value)}")
        return self

    def remove(self, name: str | tuple[str, ...]) -> Update:
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


def fence_condition(e: Expr, ref: AttemptRef) -> str:
    """The condition that the step item's attempt `ref.n` is exactly `ref`'s and running."""
    record = attempt_attr(ref.n)
    return " AND ".join(
        [
            e.eq((record, "t"), ref.token),
            e.eq((record, "s"), pack_time(ref.started_at)),
            e.eq((record, "r"), pack_time(ref.resumed_at)),
            e.eq((record, "st"), AttemptStatus.running.value),
            e.eq("live_n", ref.n),
        ]
    )


def fence_holds(item: dict[str, Any] | None, ref: AttemptRef) -> bool:
    """What `fence_condition` asks, of a step item as read."""
    record = record_of(item, ref.n)
    if record is None or item is None:
        return False
    return bool(
        record.get("t", {}).get("S") == ref.token
        and time_of(record.get("s")) == ref.started_at
        and time_of(record.get("r")) == ref.resumed_at
        and record.get("st", {}).get("S") == AttemptStatus.running.value
        and item.get("live_n", {}).get("N") == str(ref.n)
    )


def step_filter(e: Expr, group: int | None, where: StepFilter | None) -> list[str]:
    """The filter conditions for one group and a `StepFilter`'s per-step filters (its index
    range is the key condition's)."""
    kept = [e.eq("group", group)] if group is not None else []
    if where is None:
        return kept
    if where.statuses is not None:
        kept.append(e.one_of("status", sorted(where.statuses)))
    if where.flow:
        kept.append(e.absent("rescue_of"))
    if where.settling:
        kept.append(f"({e.exists('rescue_of')} OR NOT ({e.one_of('status', ['completed', 'skipped'])}))")
    if where.agent is not None:
        kept.append(e.eq("agent", where.agent))
    if where.started_by is not None:
        kept.append(f"{e.n('started_at')} <= {e.v(where.started_by)}")
    return kept
