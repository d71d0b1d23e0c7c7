"""Running the engine's threads against moto's DynamoDB (tests, benchmarks).

moto's DynamoDB is not thread-safe: a refused transaction restores a deep copy of the whole
table it took before, undoing other threads' writes meanwhile. DynamoDB itself serializes
writes to an item, so serializing moto's request handling keeps its semantics."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from unittest import mock

_LOCK = threading.RLock()



@contextlib.contextmanager
def serialized_dynamodb() -> Iterator[None]:
    from moto.dynamodb.responses import DynamoHandler

    handle = DynamoHandler.call_action

    def call_action(self):  # type: ignore[no-untyped-def]
        with _LOCK:
            return handle(self)

    with mock.patch.object(DynamoHandler, "call_action", call_action):
        yield
