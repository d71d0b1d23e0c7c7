"""The one mapping of errors to HTTP answers. Errors are types: a `LaneflowError` answers
its `http_status` (an `InvalidInput` lists its problems); a request that does not fit its
model is a 400 naming the fields; anything else is a 500 with a generic message (the
details go to the log, never to the caller). What a caller reads carries no local path
and no secret.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import (
    APIGatewayRestResolver,
    Response,
    content_types,
)
from aws_lambda_powertools.event_handler.exceptions import ServiceError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestValidationError,
)
from pydantic import BaseModel, Field

from laneflow.adapters.aws.s3 import ATTEMPTS, CACHE
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.domain.errors import InvalidInput, LaneflowError, Problem
from laneflow.domain.redaction import scrub_paths
from laneflow.ports import Services

log = logging.getLogger("laneflow.api")

GENERIC_ERROR = "something went wrong on our side; it has been logged"


class Unauthenticated(LaneflowError):
    """The request carries no identity laneflow can take a tenant from."""

    http_status = 401


class ErrorBody(BaseModel):
    """Every error the API answers: one line, and what is wrong field by field when known."""

    message: str
    problems: list[dict[str, Any]] = Field(default_factory=list)


def error_response(status: int, message: str, problems: list[dict[str, Any]] | None = None) -> Response[dict[str, Any]]:
    body = ErrorBody(message=message, problems=problems or [])
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body.model_dump())


def scrub(text: str, svc: Services | None) -> str:
    """What a caller may read: no local paths (a workspace folder becomes its name), no
    secret (a bad input may quote a secret's value back)."""
    roots = [str(CACHE), str(ATTEMPTS)]
    if svc is not None and isinstance(svc.workspaces, FolderWorkspaces):
        roots.append(str(svc.workspaces.root))
    text = scrub_paths(text, *roots)
    return svc.redactor(text) if svc is not None else text


def domain_error(exc: LaneflowError, svc: Services | None) -> Response[dict[str, Any]]:
    if exc.http_status == 500:  # not said on purpose: its message is not for the caller
        log.error("request failed: %s", type(exc).__name__, exc_info=exc)
        return error_response(exc.http_status, GENERIC_ERROR)
    message = scrub(str(exc.args[0]) if exc.args else type(exc).__name__, svc)
    problems: list[Problem] = exc.problems if isinstance(exc, InvalidInput) else []
    return error_response(
        exc.http_status,
        message,
        [p.model_copy(update={"message": scrub(p.message, svc)}).model_dump(exclude_none=True) for p in problems],
    )


def request_invalid(exc: RequestValidationError) -> Response[dict[str, Any]]:
    # Only where and what: never the input itself or pydantic's internals.
    problems = []
    for e in exc.errors():
        loc = [str(part) for part in e.get("loc", ())] or ["body"]
        where, field = loc[0], ".".join(loc[1:])[:100]
        if e.get("type") == "json_invalid":
            field = ""  # its "field" is a character position
        problems.append({"in": where, "field": field or None, "message": e.get("msg", "invalid")})
    named = ", ".join(sorted({p["field"] or p["in"] for p in problems}))
    return error_response(400, f"the request does not fit: {named}", problems)


def service_error(exc: ServiceError) -> Response[dict[str, Any]]:
    # Powertools' own (a route that does not exist is a NotFoundError).
    return error_response(exc.status_code, str(exc.msg))  # a str from Powertools; its type allows a dict


def unexpected(exc: Exception) -> Response[dict[str, Any]]:
    log.error("request failed unexpectedly: %s", type(exc).__name__, exc_info=exc)
    return error_response(500, GENERIC_ERROR)


def install(app: APIGatewayRestResolver, services: Callable[[], Services | None]) -> None:
    """Answer every error of `app`'s routes here; `services` gives the request's services
    (what the answer is scrubbed with)."""
    app.exception_handler(LaneflowError)(lambda exc: domain_error(exc, services()))
    app.exception_handler(RequestValidationError)(request_invalid)
    app.exception_handler(ServiceError)(service_error)
    app.exception_handler(Exception)(unexpected)
