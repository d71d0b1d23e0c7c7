"""The run viewer in a real browser: Debian's headless Chromium driven by Playwright, against
a real `laneflow serve` on 127.0.0.1 (laneflow_dev.browser). Skipped, saying why, only where
Chromium or Playwright is absent; CI installs both (`make setup`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, ROOT

from laneflow_dev import browser as harness

REASON = harness.missing()
# CI sets LANEFLOW_REQUIRE_BROWSER=1 (.ci/run): there a missing browser fails the tests
# instead of skipping them, so "the browser tests pass in CI" cannot pass by skipping.
REQUIRED = os.environ.get("LANEFLOW_REQUIRE_BROWSER") == "1"


def _without_browser() -> None:
    if REQUIRED:
        pytest.fail(f"LANEFLOW_REQUIRE_BROWSER=1 but {REASON}")
    pytest.skip(REASON)  # type: ignore[arg-type]


WORKSPACES = ("ws_claude", "ws_gate", "ws_control", "ws_ask")

# Where the browser tests leave their screenshots for a person to look at (build/ is not
# committed; CI may keep it as the run's artefacts). LANEFLOW_ARTEFACTS moves it.
ARTEFACTS = Path(os.environ.get("LANEFLOW_ARTEFACTS") or ROOT / "build" / "browser")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if REASON:
        _without_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=harness.CHROMIUM, args=harness.CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def served() -> Iterator[harness.Served]:
    if REASON:
        _without_browser()
    with harness.served({name: FIXTURES / name for name in WORKSPACES}) as running:
        yield running


@pytest.fixture
def page(chromium: Any, served: harness.Served) -> Iterator[Any]:
    """A page at 1280 px that records every request it makes, every answer (status, URL) and
    every script error."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.requests, opened.responses, opened.errors = [], [], []
    opened.on("request", lambda request: opened.requests.append(request.url))
    opened.on("response", lambda response: opened.responses.append((response.status, response.url)))
    opened.on("pageerror", lambda error: opened.errors.append(str(error)))
    opened.set_default_timeout(20000)
    yield opened
    context.close()


@pytest.fixture
def artefacts() -> Path:
    """The folder the screenshots go to (made if absent)."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    return ARTEFACTS
