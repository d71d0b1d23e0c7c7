"""The one place that creates the Logger, Tracer and Metrics, and the `Telemetry` adapter
the use cases bind log keys and emit step metrics through.

In Lambda, handlers are wrapped by `laneflow.entrypoints.lambda_handler`: Powertools' Logger (JSON, with the
Lambda context and the run id, step and attempt of what is being handled), Tracer (X-Ray)
and Metrics (EMF). The domain's own loggers (`laneflow.*`) are routed through the same
Logger. Locally (the embedded engine calls the same handlers from many threads, and the
CLI's stdout belongs to `--json`) all of it stays off: logs go to stderr, no EMF is printed.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

from laneflow.settings import settings

SERVICE = "laneflow"

NAMESPACE = "laneflow"

IN_LAMBDA = settings().in_lambda

# POWERTOOLS_LOG_LEVEL wins (and, in Lambda, the function's own log-level control over it);
# unset, Lambda logs INFO and a local process WARNING (stderr belongs to the person).
LOG_LEVEL = settings().log_level or (None if IN_LAMBDA else "WARNING")


class _CurrentStream(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes to whatever `sys.stdout` / `sys.stderr` is when a record
    is emitted, not what it was when this module was imported: this module may be imported
    first inside a test (or a redirected block) whose stream is closed afterwards, and a
    write to a closed stream makes `logging` print the record's original exception, unmasked,
    as a "Logging error"."""

    def __init__(self, which: str):
        self._which = which
        super().__init__()

    @property
    def stream(self) -> Any:
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler's constructor sets it; the property decides
        pass


logger = Logger(
    service=SERVICE,
    level=LOG_LEVEL,
    logger_handler=_CurrentStream("stdout" if IN_LAMBDA else "stderr"),
)

# In Lambda POWERTOOLS_TRACE_DISABLED decides. Locally there is none: it would be disabled,
# and making one imports the X-Ray SDK (~0.19 s of CPU of every process that runs handlers).
tracer = Tracer(service=SERVICE) if IN_LAMBDA else None

metrics = Metrics(namespace=NAMESPACE, service=SERVICE)

if IN_LAMBDA:
    copy_config_to_registered_loggers(source_logger=logger, include={"laneflow"})


def bind(**keys: Any) -> None:
    """Add keys (e.g. the attempt, once claimed) to every later log line of this invocation."""
    if IN_LAMBDA:
        logger.append_keys(**keys)


def metric(name: str, unit: MetricUnit, value: float) -> None:
    if IN_LAMBDA:
        metrics.add_metric(name=name, unit=unit, value=value)


def step_metrics(
    *, cost_usd: float, duration_ms: float, calls: list[Any], gate_wait_ms: float | None, savings_usd: float | None = None
) -> None:
    """What one step attempt cost and how the prompt cache served it (`CacheSavingsUSD`: what
    it saved, laneflow.domain.savings; below zero when it only wrote)."""
    if not IN_LAMBDA:
        return
    metric("StepCostUSD", MetricUnit.NoUnit, cost_usd)
    metric("StepDuration", MetricUnit.Milliseconds, duration_ms)
    metric("CacheReadTokens", MetricUnit.Count, sum(c.tokens.cache_read for c in calls))
    metric("CacheWriteTokens", MetricUnit.Count, sum(c.tokens.cache_write for c in calls))
    metric("ColdPrefixesWritten", MetricUnit.Count, sum(1 for c in calls[:1] if c.tokens.cache_write))
    if gate_wait_ms is not None:
        metric("GateWait", MetricUnit.Milliseconds, gate_wait_ms)
    if savings_usd is not None:
        metric("CacheSavingsUSD", MetricUnit.NoUnit, savings_usd)


class PowertoolsTelemetry:
    """`Telemetry` in Lambda: log keys on the one Logger, step metrics as EMF."""

    metrics_on = True

    def bind(self, **keys: Any) -> None:
        bind(**keys)

    def step_metrics(
        self,
        *,
        cost_usd: float,
        duration_ms: float,
        calls: list[Any],
        gate_wait_ms: float | None,
        savings_usd: float | None = None,
    ) -> None:
        step_metrics(cost_usd=cost_usd, duration_ms=duration_ms, calls=calls, gate_wait_ms=gate_wait_ms, savings_usd=savings_usd)
