"""The Lambda wrapper of every thin handler: Powertools' Logger (with the Lambda context and
the run id, step and tenant of the event), Tracer and Metrics in Lambda; nothing locally."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from laneflow.adapters.aws.powertools import IN_LAMBDA, logger, metrics, tracer


def _keys_of(event: Any) -> dict[str, Any]:
    """The run id, step and tenant an event is about (every log line carries them)."""
    if not isinstance(event, dict):
        return {}
    run: dict[str, Any] = event["run"] if isinstance(event.get("run"), dict) else event
    keys = {"run_id": run.get("run_id"), "tenant": run.get("tenant")}
    step = event.get("step")
    if isinstance(step, dict):
        keys["step"] = step.get("index")
    return {k: v for k, v in keys.items() if v is not None}



def lambda_handler(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wrap a thin handler with Powertools in Lambda; leave it as it is locally."""
    if not IN_LAMBDA:
        return fn

    @functools.wraps(fn)
    def keyed(event: Any, context: Any) -> Any:
        logger.append_keys(**_keys_of(event))
        result = fn(event, context)
        logger.info("handled", extra={"outcome": result.get("status") if isinstance(result, dict) else None})
        return result

    wrapped = metrics.log_metrics(tracer.capture_lambda_handler(keyed))
    return logger.inject_lambda_context(clear_state=True)(wrapped)
