"""Shared fixtures: a fresh SQLite store per test, and a helper that runs a flow through the
real state machine definition on the embedded engine."""

from __future__ import annotations
from laneflow.wiring import for_store, local_engine

from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.engine.local import DriveResult
from laneflow.usecases.start_run import create_run
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.adapters.store import open_store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLES = ROOT / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-backend",
        choices=("sqlite", "dynamodb", "all"),
        default="all",
        help="which stores the store contract (tests/contract/store) runs on (default: all)",
    )


@pytest.fixture
def svc(tmp_path: Path) -> Services:
    store = open_store(f"sqlite:///{tmp_path / 'laneflow.db'}")
    return for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


@pytest.fixture
def run_flow(svc: Services):
    """run_flow(workspace, flow, input) -> DriveResult, through the real definition."""

    engine = local_engine(svc)

    def _run(workspace: str | Path, flow: str, run_input: Any = None, **kwargs: Any) -> DriveResult:
        run = create_run(svc, workspace, flow, run_input, **kwargs)
        return engine.drive(run.tenant, run.id, tick_s=0.02)

    _run.engine = engine  # type: ignore[attr-defined]
    return _run



# The engine's threads against moto's DynamoDB (see laneflow/engine/moto_support.py).
from laneflow_dev.moto_support import serialized_dynamodb as moto_dynamodb_serialized  # noqa: E402,F401
