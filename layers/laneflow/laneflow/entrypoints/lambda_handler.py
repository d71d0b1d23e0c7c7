"""The Lambda wrapper of every thin handler: the run's secrets masked while it works (in Lambda
and on the embedded engine alike), and in Lambda Powertools' Logger (with the Lambda context
and the run id, step and tenant of the event), Tracer and Metrics."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from laneflow.adapters.aws.powertools import IN_LAMBDA, logger, metrics, tracer
from laneflow.usecases.masking import masking_of
from laneflow.wiring import services


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
    """Wrap a thin handler: the run its event names is masked while it works (`masked_run`);
    in Lambda, Powertools too."""
    masked = masked_run(fn)
    if not IN_LAMBDA:
        return masked

    @functools.wraps(fn)
    def keyed(event: Any, context: Any) -> Any:
        logger.append_keys(**_keys_of(event))
        result = masked(event, context)
        logger.info("handled", extra={"outcome": result.get("status") if isinstance(result, dict) else None})
        return result

    assert tracer is not None  # made in Lambda
    wrapped = metrics.log_metrics(tracer.capture_lambda_handler(keyed))
    return logger.inject_lambda_context(clear_state=True)(wrapped)


def masked_run(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`fn` with the values of the run its event names (every secret any agent of its flow
    declares, and the model's key) held by the services' redactor while it runs, so whatever
    it writes or logs is masked, whichever handler it is: the one place every handler of the
    state machine passes, in a Lambda (which reads the run's values once per invocation and
    drops them at its end) and on the embedded engine (where the drive holds them already)."""

    @functools.wraps(fn)
    def masked(event: Any, context: Any) -> Any:
        keys = _keys_of(event)
        tenant, run_id = keys.get("tenant"), keys.get("run_id")
        if not (isinstance(tenant, str) and isinstance(run_id, str)):
            return fn(event, context)  # no run (the schedule's reconcile): nothing of one to mask
        with masking_of(services(), tenant, run_id):
            return fn(event, context)

    return masked
