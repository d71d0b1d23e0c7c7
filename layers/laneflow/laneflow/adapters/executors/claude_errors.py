"""What the Claude executor makes of the Messages API's errors: the refusals that fail a step
for good (each with a message that says what to fix), what is retried with backoff (rate
limits, 5xx, overloaded answers, a connection or read lost mid-stream) and how long the API
asks to wait, and what a timeout is."""

from __future__ import annotations

from typing import Any

import anthropic

from laneflow.domain.errors import StepFailed

try:  # the transport the SDK streams over (httpx2 from anthropic 2.x, httpx before)
    import httpx2 as _http
except ImportError:  # pragma: no cover
    import httpx as _http  # type: ignore[no-redef]


# A read or connection error mid-stream surfaces as the transport's own exception.
RETRYABLE = (anthropic.RateLimitError, anthropic.InternalServerError, anthropic.APIConnectionError, _http.TransportError)

TIMEOUTS = (anthropic.APITimeoutError, _http.TimeoutException)

# What the API refuses for a reason a retry cannot change.
REFUSALS = (anthropic.AuthenticationError, anthropic.PermissionDeniedError, anthropic.NotFoundError, anthropic.BadRequestError)


def refusal(exc: anthropic.APIStatusError, model: str) -> StepFailed:
    """The step's failure for one of REFUSALS: not retryable, saying what was refused."""
    if isinstance(exc, anthropic.AuthenticationError):
        return StepFailed(
            "the model API refused the credentials (authentication failed): check ANTHROPIC_API_KEY", retryable=False
        )
    if isinstance(exc, anthropic.PermissionDeniedError):
        return StepFailed("the model API refused this request (permission denied)", retryable=False)
    if isinstance(exc, anthropic.NotFoundError):
        return StepFailed(f"the model API does not know model {model!r}", retryable=False)
    return StepFailed(f"the model API rejected the request: {message(exc)}", retryable=False)


def message(exc: anthropic.APIStatusError) -> str:
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
    return str(error.get("message") or exc.message)[:300]


def describe(exc: Exception) -> str:
    if isinstance(exc, anthropic.APIStatusError):
        return f"{exc.status_code} {message(exc)}"
    return type(exc).__name__


def retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
