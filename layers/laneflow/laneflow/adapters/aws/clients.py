"""A boto3 client made on first use, once per adapter object, safe from many threads: a
handler that never calls a service never builds (or imports) its client, and a test hands
the adapter its own client."""

from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

C = TypeVar("C")  # the service's client type (types-boto3's, e.g. ECSClient)


class LazyClient(Generic[C]):
    """The base of an adapter over one AWS service (`service`, boto3's name for it) whose
    client is a `C`."""

    service = ""

    def __init__(self, client: C | None = None, *, region: str | None = None):
        self._client = client
        self._region = region
        self._client_lock = threading.Lock()

    @property
    def client(self) -> C:
        with self._client_lock:
            if self._client is None:
                import boto3

                make: Any = boto3.client  # the service is a plain string here, not one of the stubs' literals
                self._client = make(self.service, region_name=self._region)
            return self._client
