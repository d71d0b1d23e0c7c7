"""AWS Secrets Manager: the model's key (read by the functions that run steps, once), and
agents' declared secrets, under `laneflow/<tenant>/<NAME>` (read for each attempt)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from laneflow.domain.errors import ModelNotConfigured, StepFailed
from laneflow.domain.tenants import check_tenant

if TYPE_CHECKING:
    from types_boto3_secretsmanager import SecretsManagerClient


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
        raise ModelNotConfigured(
            f"the model's key could not be read from Secrets Manager secret {name!r}: {type(error).__name__}"
        ) from None
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


# Error codes that may go away on their own (the attempt is retried); any other refusal
# (AccessDenied, a KMS key it may not use) is for a person to fix.
_TEMPORARY = frozenset({"ThrottlingException", "InternalServiceError", "RequestLimitExceeded", "ServiceUnavailable"})


def secret_id(tenant: str, name: str) -> str:
    """Where a tenant's declared secret `name` is kept. The tenant is checked, so a step can
    only ever ask under its own run's tenant's prefix."""
    return f"laneflow/{check_tenant(tenant)}/{name}"


class SecretsManagerSecrets:
    """`SecretSource` in the cloud: each declared secret is the Secrets Manager secret
    `laneflow/<tenant>/<NAME>`, its SecretString (or, for a JSON secret, its field NAME: what
    the console's key/value form writes). A secret that does not exist (or is scheduled for
    deletion) is not set; one this role may not read fails the attempt, naming the secret."""

    def __init__(self, client: SecretsManagerClient | None = None, region: str | None = None):
        self._client = client
        self._region = region

    @property
    def client(self) -> SecretsManagerClient:
        if self._client is None:
            import boto3

            self._client = boto3.client("secretsmanager", region_name=self._region)
        return self._client

    def where(self, workspace_uri: str) -> str:
        return "Secrets Manager"

    def read(self, tenant: str, workspace_uri: str, names: list[str]) -> dict[str, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        values: dict[str, str] = {}
        for name in names:
            sid = secret_id(tenant, name)
            try:
                value = self.client.get_secret_value(SecretId=sid).get("SecretString") or ""
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "error")
                if code in ("ResourceNotFoundException", "InvalidRequestException"):  # absent, or deleted
                    continue
                raise StepFailed(
                    f"secret {name} could not be read from Secrets Manager ({sid}): {code}", retryable=code in _TEMPORARY
                ) from None
            except BotoCoreError as error:
                raise StepFailed(
                    f"secret {name} could not be read from Secrets Manager ({sid}): {type(error).__name__}"
                ) from None
            value = _field(value, name)
            if value:
                values[name] = value
        return values


def _field(value: str, name: str) -> str:
    """A JSON object secret gives its field `name` (else it is taken as it is)."""
    if value.lstrip().startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError:
            return value
        if isinstance(fields, dict) and name in fields:
            return str(fields[name])
    return value
