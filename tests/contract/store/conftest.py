"""The store contract: one suite that every `Store` implementation must pass.

Each test that takes `store` runs once per backend `--store-backend` names (`sqlite`,
`dynamodb`, or `all`, the default); `dynamo` is the DynamoDB store alone, for what only it
has (S3 blobs, its indexes, capacity), and its tests are skipped when DynamoDB is not among
the backends. Every refused write is checked twice: that it raises the right error, and
that it changed nothing (the whole run, its steps, events, calls, layers and attempts read
back equal: `snapshot`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from helpers import store_kinds

from contract.store.backends import BACKENDS, dynamodb_store
from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.ports import Store


def chosen_backends(config: pytest.Config) -> list[str]:
    return store_kinds(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store" in metafunc.fixturenames:
        names = chosen_backends(metafunc.config)
        metafunc.parametrize("store", [BACKENDS[name] for name in names], ids=names, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with request.param(tmp_path) as s:
        yield s


@pytest.fixture
def dynamo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DynamoStore]:
    """The DynamoDB store alone, for what only it has (S3 blobs, its indexes, capacity)."""
    if "dynamodb" not in chosen_backends(request.config):
        pytest.skip("--store-backend leaves DynamoDB out")
    with dynamodb_store(tmp_path, reachable_from_children=False) as s:
        yield cast(DynamoStore, s)
