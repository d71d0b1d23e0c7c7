"""The rule book's rules of the prefix registry (the prompt cache across runs).

Each public method reads the record, lets laneflow.domain.prefixes decide, and writes what
it decided only if the record's version is still the one it read; a write refused because
another writer changed the record meanwhile is decided again on what it now holds."""

from __future__ import annotations

from collections.abc import Callable

from laneflow.adapters.store.primitives import Refused
from laneflow.adapters.store.rulebook_base import RuleBase, _entry
from laneflow.domain import prefixes
from laneflow.domain.errors import Conflict
from laneflow.domain.prefixes import Change, PrefixClaim, PrefixRecord, PrefixTTL, PrefixWaiter, PrefixWriter
from laneflow.domain.tenants import check_tenant

# A decision made again this many times because other writers kept changing the record is
# given up: a prefix is never that hot (a burst of runs is a few writes each).
TRIES = 50


class PrefixRules(RuleBase):
    """The public methods of the prefix registry."""

    def _change_prefix(self, tenant: str, key: str, rule: Callable[[PrefixRecord | None], Change]) -> Change:
        for _ in range(TRIES):
            record = self._read_prefix(tenant, key)
            change = rule(record)
            if change.write is None:
                return change
            try:
                self._write_prefix(tenant, change.write, expected=None if record is None else record.version)
            except Refused:
                continue
            return change
        raise Conflict(f"prefix {key} of tenant {tenant!r} kept changing under its writers")

    @_entry()
    def get_prefix(self, tenant: str, key: str) -> PrefixRecord | None:
        check_tenant(tenant)
        return self._read_prefix(tenant, key)

    @_entry()
    def prefix_claim(self, tenant: str, key: str, *, model: str, writer: PrefixWriter, now: float) -> PrefixClaim:
        check_tenant(tenant)
        decided: list[PrefixClaim] = []

        def rule(record: PrefixRecord | None) -> Change:
            decided.clear()
            found, change = prefixes.claim(record, key, model, writer, now)
            decided.append(found)
            return change

        self._change_prefix(tenant, key, rule)
        return decided[0]

    @_entry()
    def prefix_began(
        self, tenant: str, key: str, *, model: str, run_id: str, writer: PrefixWriter | None, at: float, ttl: PrefixTTL
    ) -> list[PrefixWaiter]:
        check_tenant(tenant)
        return self._change_prefix(tenant, key, lambda r: prefixes.began(r, key, model, run_id, writer, at, ttl)).handed

    @_entry()
    def prefix_read(self, tenant: str, key: str, *, model: str, run_id: str, at: float) -> None:
        check_tenant(tenant)
        self._change_prefix(tenant, key, lambda r: prefixes.read(r, key, model, run_id, at))

    @_entry()
    def prefix_release(self, tenant: str, key: str, writer: PrefixWriter) -> list[PrefixWaiter]:
        check_tenant(tenant)
        return self._change_prefix(tenant, key, lambda r: prefixes.release(r, writer)).handed

    @_entry()
    def prefix_wait(self, tenant: str, key: str, waiter: PrefixWaiter, *, now: float) -> PrefixRecord | None:
        check_tenant(tenant)
        waits_on: list[PrefixRecord | None] = []

        def rule(record: PrefixRecord | None) -> Change:
            waits_on.clear()
            on, change = prefixes.wait(record, waiter, now)
            waits_on.append(on)
            return change

        self._change_prefix(tenant, key, rule)
        return waits_on[0]

    @_entry()
    def list_writing_prefixes(self, tenant: str | None = None) -> list[tuple[str, PrefixRecord]]:
        if tenant is not None:
            check_tenant(tenant)
        return self._writing_prefixes(tenant)
