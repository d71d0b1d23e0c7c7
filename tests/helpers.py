"""What several test files share that is not a fixture: where things are in the checkout,
and the moto helper the engine's threads need against moto's DynamoDB.

Importable as `helpers` from every test (pyproject's pytest `pythonpath` puts `tests/` on the
path); tests/conftest.py keeps only fixtures and hooks."""

from __future__ import annotations

import socket
import time
from pathlib import Path

# The engine's threads against moto's DynamoDB (see laneflow_dev/moto_support.py).
from laneflow_dev.moto_support import serialized_dynamodb as moto_dynamodb_serialized

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLES = ROOT / "examples"

__all__ = ["EXAMPLES", "FIXTURES", "ROOT", "moto_dynamodb_serialized"]


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closed the connection (None: still open after `seconds`)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - started
