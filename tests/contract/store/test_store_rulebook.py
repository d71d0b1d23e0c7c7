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


def test_every_public_method_is_the_rule_books_and_every_primitive_is_the_backends() -> None:
    assert PUBLIC <= set(vars(RuleBookStore)) and not RuleBookStore.__abstractmethods__ - PRIMITIVES
    for backend in (SqliteStore, DynamoStore):
        assert not PUBLIC & set(vars(backend)), backend.__name__
        assert PRIMITIVES <= set(vars(backend)) and not backend.__abstractmethods__, backend.__name__


def test_a_backend_that_overrides_a_rule_is_refused_when_its_class_is_made() -> None:
    with pytest.raises(TypeError, match="claim_attempt"):

        class Shortcut(SqliteStore):
            def claim_attempt(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
                raise AssertionError("never called")
