"""The rule book holds every public method of the store; a backend adds only primitives."""

from __future__ import annotations

from typing import Any

import pytest

from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.adapters.store.primitives import Primitives
from laneflow.adapters.store.rulebook import RuleBookStore
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.ports import Store

PUBLIC = {name for name, member in vars(Store).items() if getattr(member, "__isabstractmethod__", False)}
PRIMITIVES = {name for name, member in vars(Primitives).items() if getattr(member, "__isabstractmethod__", False)}


def own(backend: type) -> set[str]:
    """What a backend's own classes (the modules it is split into) define."""
    return {name for klass in backend.__mro__[: backend.__mro__.index(RuleBookStore)] for name in vars(klass)}


def test_every_public_method_is_the_rule_books_and_every_primitive_is_the_backends() -> None:
    rules = {name for klass in RuleBookStore.__mro__[: RuleBookStore.__mro__.index(Primitives)] for name in vars(klass)}
    assert PUBLIC <= rules and not RuleBookStore.__abstractmethods__ - PRIMITIVES
    for backend in (SqliteStore, DynamoStore):
        assert not PUBLIC & own(backend), backend.__name__
        assert PRIMITIVES <= own(backend) and not backend.__abstractmethods__, backend.__name__


def test_a_backend_that_overrides_a_rule_is_refused_when_its_class_is_made() -> None:
    with pytest.raises(TypeError, match="claim_attempt"):

        class Shortcut(SqliteStore):
            def claim_attempt(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
                raise AssertionError("never called")


def test_a_part_of_a_backend_that_defines_a_rule_is_refused_too() -> None:
    class Part:
        def get_run(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="get_run"):

        class Shortcut(Part, SqliteStore):  # type: ignore[misc]  # the rule it must not define
            pass


def test_the_primitives_table_lists_every_primitive_once_with_their_count() -> None:
    import re

    from laneflow.adapters.store import primitives

    table = primitives.__doc__ or ""
    listed = re.findall(r"^\| `(_\w+)`", table, re.MULTILINE)
    assert sorted(listed) == sorted(PRIMITIVES) and len(listed) == len(set(listed))
    assert f"{len(PRIMITIVES)} primitives" in table
