"""The rule book's rules of runs and steps: creating, reading, listing and updating them,
their costs, stop requests and group outlines, the active runs."""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from laneflow.adapters.store.encoding import cost
from laneflow.adapters.store.primitives import Doc, Refused
from laneflow.adapters.store.rulebook_base import (
    ACTIVE,
    RuleBase,
    _entry,
    _model,
    _readable,
    _values,
    refuse_status,
    statuses,
)
from laneflow.domain.errors import Conflict, RecordDamaged, RunNotFound
from laneflow.domain.outline import GroupOutline, StepFilter
from laneflow.domain.records import (
    READ_JSON,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
)
from laneflow.domain.tenants import check_tenant

# Runs whose input a store keeps parsed (`get_run_input`): a run's input never changes, and a
# fan-out's steps each need it (100,000 items parse in ~20 ms). Few: an input can be large.
INPUTS_KEPT = 4


class _RunInput(BaseModel):
    model_config = READ_JSON  # its items are read once each: none kept in pydantic's cache
    input: Any = Field(default_factory=dict)  # as `Run.input`


_STEPS = TypeAdapter(list[Step], config=READ_JSON)


class RunRules(RuleBase):
    """The public methods of runs and steps."""

    # -- runs ---------------------------------------------------------------------------

    @_entry("run")
    def create_run(self, run: Run) -> None:
        check_tenant(run.tenant)
        try:
            self._insert_run(run)
        except Refused:
            raise Conflict(f"run {run.id!r} exists") from None

    @_entry()
    def get_run(self, tenant: str, run_id: str, *, detail: bool = True, steps: bool = True, input: bool = True) -> Run:
        check_tenant(tenant)
        doc = self._read_run(tenant, run_id, steps=steps, detail=detail and steps, part="whole" if input else "head")
        if doc is None:
            raise RunNotFound(run_id)
        run = _model(Run, doc, f"run {run_id!r}")
        return run if input else run.model_copy(update={"input": None})

    @_entry()
    def get_run_input(self, tenant: str, run_id: str) -> Any:
        check_tenant(tenant)
        inputs, lock = self._inputs()
        key = (tenant, run_id)
        with lock:
            if key in inputs:
                inputs.move_to_end(key)
                return inputs[key]
        doc = self._read_run(tenant, run_id, part="input")
        if doc is None:
            raise RunNotFound(run_id)
        value = _model(_RunInput, doc, f"run {run_id!r}").input
        with lock:
            inputs[key] = value
            while len(inputs) > INPUTS_KEPT:
                inputs.popitem(last=False)
        return value

    def _inputs(self) -> tuple[OrderedDict[tuple[str, str], Any], threading.Lock]:
        """The inputs this store keeps parsed, by (tenant, run id), and their lock (a forked
        child starts its own: a parent's thread may have held the lock at the fork)."""
        found: tuple[int, OrderedDict[tuple[str, str], Any], threading.Lock] | None = self.__dict__.get("_kept_inputs")
        if found is None or found[0] != os.getpid():
            found = (os.getpid(), OrderedDict(), threading.Lock())
            self.__dict__["_kept_inputs"] = found
        return found[1], found[2]

    @_entry()
    def list_runs(
        self, tenant: str, *, limit: int = 50, status: Collection[RunStatus] | None = None, before: str | None = None
    ) -> list[Run]:
        check_tenant(tenant)
        wanted = statuses(status) if status is not None else None
        if wanted is not None and not wanted:
            return []
        rows = self._list_runs(tenant, limit, wanted, before)
        if rows is None:
            raise RunNotFound(str(before))  # (rows are None only when `before` is given)
        return _readable(rows)

    @_entry("changes")
    def update_run(
        self,
        tenant: str,
        run_id: str,
        changes: RunChanges,
        *,
        expect_status: Collection[RunStatus] | None = None,
        add_drives: int = 0,
    ) -> Run:
        check_tenant(tenant)
        values = _values(changes)
        if add_drives and "drives" in values:  # an amount to add lands on the value set
            values["drives"] += add_drives
            add_drives = 0
        expected = statuses(expect_status) if expect_status is not None else None
        what = f"run {run_id!r}"
        if not values and not add_drives:
            doc = self._read_run(tenant, run_id)
            if doc is None:
                raise RunNotFound(run_id)
            run = _model(Run, doc, what)
            if expected is not None and run.status.value not in expected:
                raise refuse_status(what, run.status.value, expected)
            return run
        try:
            doc = self._update_run(tenant, run_id, values, expected=expected, add_drives=int(add_drives))
        except Refused as refused:
            if refused.found is None:
                raise RunNotFound(run_id) from None
            raise refuse_status(what, refused.found, expected or ()) from None
        return _model(Run, doc, what)

    @_entry()
    def request_stop(self, tenant: str, run_id: str) -> bool:
        check_tenant(tenant)
        try:
            self._update_run(tenant, run_id, {"stop_requested": True}, expected=None, unset="stop_requested")
        except Refused as refused:
            if refused.found is None:
                raise RunNotFound(run_id) from None
            return False  # requested already
        return True

    @_entry()
    def add_run_cost(self, tenant: str, run_id: str, usd: float) -> float | None:
        check_tenant(tenant)
        amount = float(usd)
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"a cost to add is a finite amount of 0 or more, not {usd!r}")
        try:
            return self._add_run_cost(tenant, run_id, cost(amount), expected=list(ACTIVE))
        except Refused as refused:
            if refused.found is None:
                raise RunNotFound(run_id) from None
            return None

    # -- steps --------------------------------------------------------------------------

    def _steps(self, docs: list[tuple[int, Doc]], run_id: str) -> list[Step]:
        if docs and all(isinstance(doc, str) for _, doc in docs):
            try:
                return _STEPS.validate_json("[" + ",".join(doc for _, doc in docs) + "]")  # type: ignore[misc]
            except ValidationError:
                pass  # said below, naming the step
        return [_model(Step, doc, f"step {index} of run {run_id!r}") for index, doc in docs]

    @_entry()
    def get_steps(
        self,
        tenant: str,
        run_id: str,
        *,
        group: int | None = None,
        messages: bool = True,
        where: StepFilter | None = None,
    ) -> list[Step]:
        check_tenant(tenant)
        docs = self._read_steps(tenant, run_id, group=group, messages=messages, where=where)
        if not docs and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return self._steps(docs, run_id)

    @_entry()
    def get_group_outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        check_tenant(tenant)
        outline = self._read_outline(tenant, run_id)
        if not outline and not self._run_exists(tenant, run_id):
            raise RunNotFound(run_id)
        return outline

    @_entry()
    def get_step(self, tenant: str, run_id: str, index: int, *, detail: bool = False) -> Step:
        check_tenant(tenant)
        docs = self._read_steps(tenant, run_id, index=index, detail=detail)
        if not docs:
            raise self._missing_step(tenant, run_id, index)
        return self._steps(docs, run_id)[0]

    @_entry()
    def get_step_status(self, tenant: str, run_id: str, index: int) -> tuple[StepStatus, int]:
        check_tenant(tenant)
        state = self._read_step_state(tenant, run_id, index, None)
        if state is None:
            raise self._missing_step(tenant, run_id, index)
        try:
            return StepStatus(state.status), state.attempts
        except ValueError:  # as get_step would find it
            raise RecordDamaged(
                f"step {index} of run {run_id!r} cannot be read from the store: its status does not fit"
            ) from None

    @_entry("steps")
    def add_steps(self, tenant: str, run_id: str, steps: list[Step]) -> None:
        check_tenant(tenant)
        try:
            added = self._insert_steps(tenant, run_id, steps)
        except Refused:
            raise Conflict(f"run {run_id!r}: a step index among {[s.index for s in steps]} is taken") from None
        if not added:
            raise RunNotFound(run_id)

    @_entry("changes")
    def update_step(
        self,
        tenant: str,
        run_id: str,
        index: int,
        changes: StepChanges,
        *,
        expect_status: Collection[StepStatus] | None = None,
    ) -> Step:
        check_tenant(tenant)
        values = _values(changes)
        expected = statuses(expect_status) if expect_status is not None else None
        what = f"step {index} of run {run_id!r}"
        if not values:
            step = self.get_step(tenant, run_id, index)
            if expected is not None and step.status.value not in expected:
                raise refuse_status(what, step.status.value, expected)
            return step
        try:
            doc = self._update_step(tenant, run_id, index, values, expected=expected)
        except Refused as refused:
            if refused.found is None:
                raise self._missing_step(tenant, run_id, index) from None
            raise refuse_status(what, refused.found, expected or ()) from None
        return _model(Step, doc, what)

    # -- active runs ----------------------------------------------------------------------

    @_entry()
    def active_runs(self, tenant: str | None = None) -> list[Run]:
        if tenant is not None:
            check_tenant(tenant)
        return _readable(self._active_runs(tenant))
