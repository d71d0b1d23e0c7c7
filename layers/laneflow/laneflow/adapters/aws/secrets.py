"""The model's key in AWS Secrets Manager: read by the functions that run steps, once."""

from __future__ import annotations

import json

from laneflow.domain.errors import ModelNotConfigured


def read_model_key(name: str) -> str:
    """The model's key from the Secrets Manager secret `name`: its SecretString, or the
    `ANTHROPIC_API_KEY` field of a JSON secret (what the console's key/value form writes).
    Raises `ModelNotConfigured` naming the secret and the error code, never the value."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        value = boto3.client("secretsmanager").get_secret_value(SecretId=name).get("SecretString") or ""
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "error")
        raise ModelNotConfigured(f"the model's key could not be read from Secrets Manager secret {name!r}: {code}") from None
    except BotoCoreError as error:
        raise ModelNotConfigured(f"the model's key could not be read from Secrets Manager secret {name!r}: {type(error).__name__}") from None
    value = value.strip()
    if value.startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError:
            fields = None
        if isinstance(fields, dict):
            value = str(fields.get("ANTHROPIC_API_KEY") or "").strip()
    if not value:
        raise ModelNotConfigured(f"Secrets Manager secret {name!r} holds no model key (a string, or JSON with ANTHROPIC_API_KEY)")
    return value
