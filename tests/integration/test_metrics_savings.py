"""The `CacheSavingsUSD` metric: in Lambda, a step's metrics carry what its prompt cache
saved when the caller gives it (below zero for a step that only wrote), as EMF beside the
step's cost; not given, no such metric. Run in a process of its own, as Lambda's is (the
Powertools adapter decides at import whether it is in Lambda)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
from laneflow.adapters.aws.powertools import PowertoolsTelemetry, metrics
from laneflow.domain.records import ModelCall, Tokens
calls = [ModelCall(id="c1", model="claude-sonnet-4-6", tokens=Tokens(cache_write=5000))]
PowertoolsTelemetry().step_metrics(cost_usd=0.02, duration_ms=120, calls=calls, gate_wait_ms=None, savings_usd=SAVED)
metrics.flush_metrics()
"""


def emitted(saved: str) -> dict[str, object]:
    env = {**os.environ, "AWS_LAMBDA_FUNCTION_NAME": "RunStepFunction", "POWERTOOLS_TRACE_DISABLED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("SAVED", saved)], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    [emf] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{") and "_aws" in line]
    record: dict[str, object] = emf
    return record


def names(emf: dict[str, object]) -> set[str]:
    aws = emf["_aws"]
    assert isinstance(aws, dict)
    return {m["Name"] for m in aws["CloudWatchMetrics"][0]["Metrics"]}


def test_a_steps_metrics_carry_its_cache_savings_when_given_and_none_when_not() -> None:
    given = emitted("-0.00375")
    assert {"StepCostUSD", "CacheWriteTokens", "CacheSavingsUSD"} <= names(given)
    assert given["CacheSavingsUSD"] in (-0.00375, [-0.00375])
    assert given["CacheWriteTokens"] in (5000, [5000])
    absent = emitted("None")
    assert "StepCostUSD" in names(absent) and "CacheSavingsUSD" not in names(absent)
