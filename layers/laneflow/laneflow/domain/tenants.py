"""Tenant names: the one check every entrance uses.

Everything stored is keyed by tenant first (DynamoDB keys `T#<tenant>#...`, S3 prefixes
`workspaces/<tenant>/`, `captures/<tenant>/`), so a tenant name must be a plain token: a
`#` would run into the next part of a key, a `/` would reach into another prefix. The API's
caller, `LANEFLOW_TENANT` and the stores' entry points all call `check_tenant`.
"""

from __future__ import annotations

import re

from laneflow.domain.errors import InvalidInput

TENANT_MAX_CHARS = 64

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")

_ALLOWED = re.compile(r"[A-Za-z0-9._@-]")

_RULE = f"a tenant is 1 to {TENANT_MAX_CHARS} letters, digits, '.', '_', '-' or '@', starting with a letter or digit"


class TenantInvalid(InvalidInput):
    """A tenant name laneflow cannot key data by (empty, too long, or a character such as
    `#`, `/` or a control character)."""


def _shown(tenant: str) -> str:
    """The tenant as an error may show it: quoted with control characters escaped, cut."""
    return repr(tenant if len(tenant) <= 40 else tenant[:40] + "…")


def check_tenant(tenant: object, *, source: str = "tenant") -> str:
    """`tenant` when it is a valid tenant name; else `TenantInvalid` naming `source` (where
    the name came from: "tenant", "LANEFLOW_TENANT", "the caller's tenant") and the name."""
    if not isinstance(tenant, str) or not tenant:
        raise TenantInvalid(f"{source} is empty: {_RULE}")
    if len(tenant) > TENANT_MAX_CHARS:
        raise TenantInvalid(f"{source} {_shown(tenant)} is {len(tenant)} characters long: {_RULE}")
    if not _TENANT.fullmatch(tenant):
        bad = next((c for c in tenant if not _ALLOWED.fullmatch(c)), None)
        what = f"cannot contain {bad!r}" if bad else f"cannot start with {tenant[0]!r}"
        raise TenantInvalid(f"{source} {_shown(tenant)} {what}: {_RULE}")
    return tenant
