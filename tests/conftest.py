"""Shared fixtures: a fresh SQLite store per test, and a helper that runs a flow through the
real state machine definition on the embedded engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from helpers import FlowRunner, ServicesOn, services_on, store_kinds

from laneflow.adapters.engine.local import DriveResult
from laneflow.adapters.store import open_store
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine


def pytest_configure(config: pytest.Config) -> None:
    # Powertools' Logger (the `laneflow` logger's handler) binds the sys.stderr of the moment
    # it is first imported. Imported here, that is pytest's session-wide capture; imported by
    # the first handler a test calls, it would be that test's capsys or capfd, closed after
    # it, and every later log line would fail to write (a "--- Logging error ---" on stderr).
    import laneflow.adapters.aws.powertools  # noqa: F401


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-backend",
        choices=("sqlite", "dynamodb", "all"),
        default="all",
        help="which stores every test run on both stores runs on (default: all)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The one way a test runs on both stores: it takes `store_kind` (or a fixture that does),
    # and runs once per store `--store-backend` names.
    if "store_kind" in metafunc.fixturenames:
        metafunc.parametrize("store_kind", store_kinds(metafunc.config), indirect=True)


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """`sqlite` or `dynamodb` (under moto): the store this run of the test is on."""
    return str(request.param)


@pytest.fixture
def svc(tmp_path: Path) -> Services:
    store = open_store(f"sqlite:///{tmp_path / 'laneflow.db'}")
    return for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


@pytest.fixture
def on(store_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServicesOn]:
    """on(**env) -> Services on the store of `store_kind`, SQLite or DynamoDB under moto (one
    per test); `env` is the environment its settings are read from."""
    opened: list[Any] = []

    def make(**env: str) -> Services:
        cm = services_on(store_kind, tmp_path, monkeypatch, **env)
        opened.append(cm)
        return cm.__enter__()

    make.kind = store_kind  # type: ignore[attr-defined]
    yield cast(ServicesOn, make)
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


@pytest.fixture
def run_flow(svc: Services) -> FlowRunner:
    """run_flow(workspace, flow, input) -> DriveResult, through the real definition."""

    engine = local_engine(svc)

    def _run(workspace: str | Path, flow: str, run_input: Any = None, **kwargs: Any) -> DriveResult:
        run = create_run(svc, workspace, flow, run_input, **kwargs)
        return engine.drive(run.tenant, run.id, tick_s=0.02)

    _run.engine = engine  # type: ignore[attr-defined]
    return cast(FlowRunner, _run)
