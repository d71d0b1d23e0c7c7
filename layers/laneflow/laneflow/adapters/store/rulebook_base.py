"""What the rule book's parts share: its constants, its refusal and damage messages, the
wrapper of every public method (`_entry`: counted, masked), reading records into models,
and `RuleBase`, the primitives and the `Store` port every part builds on (see
laneflow.adapters.store.rulebook)."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from laneflow.adapters.store.encoding import cost
from laneflow.adapters.store.primitives import Doc, Fenced, Primitives
from laneflow.domain.errors import AttemptEnded, Conflict, NotFound, RecordDamaged, RunNotFound
from laneflow.domain.records import (
    READ_JSON,
    AttemptRef,
    Changes,
    Run,
    RunStatus,
)
from laneflow.domain.redaction import Redactor
from laneflow.ports import Store

log = logging.getLogger("laneflow.store")

ACTIVE = (RunStatus.queued.value, RunStatus.running.value, RunStatus.awaiting_approval.value)

CLAIM_TRIES = 20  # decisions made again when the step changed between the read and the write

# Conditional writes made again when what they are conditional on changed meanwhile (a
# journal entry begun or settled, a fenced write whose step item moved on): each try reads
# what the last refusal found, so more than a few means writers racing without end.
WRITE_TRIES = 10


# -- messages ---------------------------------------------------------------------------------


def statuses(values: Collection[Any]) -> list[str]:
    if isinstance(values, str):  # one status given bare (a StrEnum is a str too)
        values = [values]
    return [str(getattr(v, "value", v)) for v in values]


def refuse_status(what: str, found: str, expected: Collection[Any]) -> Conflict:
    return Conflict(f"{what} is {found}, not {' or '.join(statuses(expected)) or 'any status'}")


def attempt_ended(ref: AttemptRef, found: Fenced) -> AttemptEnded:
    what = f"attempt {ref.n} of step {ref.index} of run {ref.run_id!r}"
    stored = found.attempt
    if stored is None:
        return AttemptEnded(f"{what} has ended" if 0 < ref.n <= found.last_n else f"{what} does not exist")
    if (stored.token, stored.started_at, stored.resumed_at) != (ref.token, ref.started_at, ref.resumed_at):
        return AttemptEnded(f"{what} is not the attempt named (its token or times differ); it is {stored.status}")
    return AttemptEnded(f"{what} has ended ({stored.status})")


def damaged(what: str, fields: list[str]) -> RecordDamaged:
    """A stored record whose named fields do not parse (a NaN written before entrances
    refused it, a hand edit)."""
    fields = fields or ["record"]
    verb = "is" if len(fields) == 1 else "are"
    return RecordDamaged(f"{what} cannot be read from the store: its {' and '.join(fields)} {verb} not valid JSON")


def trace_damaged(what: str) -> RecordDamaged:
    return RecordDamaged(f"{what} cannot be read from the store: its trace does not parse")


def misfit(what: str, error: ValidationError) -> RecordDamaged:
    """A stored record that no longer fits its model (hand-edited, or of another version)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "record"
    return RecordDamaged(f"{what} cannot be read from the store: its {where} does not fit ({first.get('msg', 'invalid')})")


def no_step(index: int, run_id: str) -> NotFound:
    return NotFound(f"no step {index} in run {run_id!r}")


# -- the entry points' wrapper ------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _entry(*masked: str) -> Callable[[_F], _F]:
    """A public method: counted under its own name (`_operation`), its named arguments
    masked by the store's redactor before anything else sees them."""

    def wrap(method: _F) -> _F:
        signature = inspect.signature(method)

        @functools.wraps(method)
        def entry(self: RuleBase, *args: Any, **kwargs: Any) -> Any:
            redactor = self.redactor
            if masked and redactor:  # nothing to mask: no cost on the write path
                bound = signature.bind(self, *args, **kwargs)
                for name in masked:
                    if name in bound.arguments:
                        bound.arguments[name] = redactor.value(bound.arguments[name])
                args, kwargs = bound.args[1:], bound.kwargs
            with self._operation(method.__name__):
                return method(self, *args, **kwargs)

        entry.__masks__ = masked  # type: ignore[attr-defined]
        return entry  # type: ignore[return-value]

    return wrap


_RUNS = TypeAdapter(list[Run], config=READ_JSON)

_M = TypeVar("_M", bound=BaseModel)


def _model(model: type[_M], doc: Doc, what: str) -> _M:
    try:
        return model.model_validate_json(doc) if isinstance(doc, str) else model.model_validate(doc)
    except ValidationError as error:
        raise misfit(what, error) from None


def _readable(rows: list[tuple[str, Doc | RecordDamaged]]) -> list[Run]:
    """The runs of (id, record) rows, leaving out - with a warning naming it - any that
    cannot be read, so one damaged run never stops a list (or reconcile)."""
    docs: list[tuple[str, Doc]] = []
    for run_id, doc in rows:
        if isinstance(doc, RecordDamaged):
            log.warning("run %s left out: %s", run_id, doc)
        else:
            docs.append((run_id, doc))
    if docs and all(isinstance(doc, str) for _, doc in docs):
        try:  # one validation of them all: the common case
            return _RUNS.validate_json("[" + ",".join(doc for _, doc in docs) + "]")  # type: ignore[misc]
        except ValidationError:
            pass
    runs = []
    for run_id, doc in docs:
        try:
            runs.append(_model(Run, doc, f"run {run_id!r}"))
        except RecordDamaged as error:
            log.warning("run %s left out: %s", run_id, error)
    return runs


def _values(changes: Changes | None) -> dict[str, Any]:
    values = changes.changed() if changes is not None else {}
    for name in ("cost_usd", "savings_usd"):
        if name in values:
            values[name] = cost(values[name])
    return values


# -- what every part builds on --------------------------------------------------------------


class RuleBase(Primitives, Store):
    """The primitives, the store's redactor, and what more than one part of the rules uses."""

    @property
    def redactor(self) -> Redactor:
        found: Redactor | None = self.__dict__.get("_redactor")
        if found is None:
            found = self.__dict__.setdefault("_redactor", Redactor())
        return found

    @contextmanager
    def _operation(self, name: str) -> Iterator[None]:
        """Around each public method (a backend counts what it consumes by method)."""
        yield

    def _run_exists(self, tenant: str, run_id: str) -> bool:
        return self._read_run(tenant, run_id, part="key") is not None

    def _missing_step(self, tenant: str, run_id: str, index: int) -> NotFound:
        return no_step(index, run_id) if self._run_exists(tenant, run_id) else RunNotFound(run_id)
