"""The suite runs a test on both stores one way only: through `store_kind` (or the contract
suite's `store`), which runs it once per store `--store-backend` names. A test that chose its
stores another way would carry the other store's name in its id under `--store-backend sqlite`
(or the reverse), and this finds it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT

PARAM = re.compile(r"\[(?P<params>[^\]]*)\]$")


def collected(backend: str) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "--store-backend",
            backend,
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def stores_named(ids: list[str]) -> set[str]:
    named = set()
    for node in ids:
        found = PARAM.search(node)
        if found:
            named |= {kind for kind in ("sqlite", "dynamodb") if kind in found["params"].split("-")}
    return named


@pytest.mark.slow
def test_store_backend_decides_which_stores_every_both_stores_test_runs_on() -> None:
    assert stores_named(collected("all")) == {"sqlite", "dynamodb"}  # the suite does run tests on both
    # A test that chose its stores itself would still be collected on DynamoDB here.
    ids = collected("sqlite")
    leaks = [node for node in ids if "dynamodb" in stores_named([node])]
    assert leaks == [], f"--store-backend sqlite still runs these on DynamoDB: {leaks[:5]}"
    assert "sqlite" in stores_named(ids)
