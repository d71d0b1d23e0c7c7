"""The API's own OpenAPI document, as true as the API: the errors it really answers (a
request that does not fit is a 400 here, never the 422 Powertools would list), how a caller
authenticates (SigV4 for machines, a Cognito user pool token for people), and the server it
is on (the stage's URL behind API Gateway, this host locally)."""

from __future__ import annotations

import json
from typing import Any

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "sigv4": {
        "type": "apiKey",
        "name": "Authorization",
        "in": "header",
        "description": "AWS Signature Version 4 (IAM): machines. The tenant is the caller's account id.",
        "x-amazon-apigateway-authtype": "awsSigv4",
    },
    "cognito": {
        "type": "apiKey",
        "name": "Authorization",
        "in": "header",
        "description": "A Cognito user pool ID token (people, when the stack has a user pool): the tenant is its custom:tenant claim.",
        "x-amazon-apigateway-authtype": "cognito_user_pools",
    },
}

# Routes anyone may read: the document itself and the viewer's page and assets.
PUBLIC = frozenset({"/openapi.json", "/", "/assets/{name}"})


def shape(document_json: str, *, server: str) -> str:
    """Powertools' document, corrected: no 422 (and no schema only a 422 used), the security
    schemes and which routes need them, and `server` as the one server."""
    document: dict[str, Any] = json.loads(document_json)
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            operation["security"] = [] if path in PUBLIC else [{"sigv4": []}, {"cognito": []}]
    # Powertools' validation schemas were used only by the 422s.
    referenced = json.dumps(document.get("paths", {}))
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ResponseValidationError", "ValidationError"):
        others = json.dumps({name: schema for name, schema in schemas.items() if name != unused})
        if f"#/components/schemas/{unused}" not in referenced + others:
            schemas.pop(unused, None)
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    document["security"] = [{"sigv4": []}, {"cognito": []}]
    document["servers"] = [{"url": server, "description": "this API (the stage's URL behind API Gateway)"}]
    return json.dumps(document)


def server_url(event: dict[str, Any], base: str) -> str:
    """The URL of the API that answered `event`: scheme and host as the caller used them,
    and the stage's path (`base`)."""
    headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
    host = headers.get("host")
    if not isinstance(host, str) or not host:
        return base or "/"
    proto = headers.get("x-forwarded-proto") if isinstance(headers.get("x-forwarded-proto"), str) else None
    return f"{proto or 'http'}://{host}{base}"
