"""Declared secrets: what an agent's `secrets:` asks for, and the name each value crosses under.

`secrets: [NAME, "@NAME"]`: `NAME` reaches the step's programs as the environment variable
`NAME`; `@NAME` as a file (mode 0600, removed when the attempt ends) whose path is in `$NAME`.
A name that laneflow or the model reads for itself (`ANTHROPIC_*`, `LANEFLOW_*`, `AWS_*`)
never replaces those settings: it crosses as `LANEFLOW_DECLARED_<NAME>`, and the trace says why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from laneflow.domain.errors import InvalidInput

# Prefixes of the variables the model's SDK, laneflow and the AWS SDK read for themselves.
RESERVED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("ANTHROPIC_", "the model's own settings"),
    ("LANEFLOW_", "laneflow's own settings"),
    ("AWS_", "the AWS SDK's own settings and credentials"),
)

DECLARED_PREFIX = "LANEFLOW_DECLARED_"

# The folder an attempt's `@NAME` files are written in is named so (in the temp folder).
SECRET_FOLDER_PREFIX = "laneflow-secrets-"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class DeclaredSecret:
    """One entry of an agent's `secrets:`."""

    name: str  # the name it is looked up by (Secrets Manager `laneflow/<tenant>/<name>`, a dotenv key)
    as_file: bool  # written `@NAME`: given as a file whose path is in the variable

    @property
    def reserved_by(self) -> str | None:
        """Whose settings the name collides with (None: it crosses as it is)."""
        upper = self.name.upper()
        return next((whose for prefix, whose in RESERVED_PREFIXES if upper.startswith(prefix)), None)

    @property
    def env_name(self) -> str:
        """The variable the step's programs find it in."""
        return DECLARED_PREFIX + self.name if self.reserved_by else self.name


def declared_secrets(entries: list[str], *, agent: str = "") -> list[DeclaredSecret]:
    """An agent's `secrets:` read: each `NAME` or `@NAME`, a name of letters, digits and `_`
    (not starting with a digit). A bad or repeated name is `InvalidInput` naming the agent."""
    found: list[DeclaredSecret] = []
    seen: set[str] = set()
    whose = f" of agent {agent}" if agent else ""
    for entry in entries:
        raw = entry.strip() if isinstance(entry, str) else ""
        as_file = raw.startswith("@")
        name = raw[1:] if as_file else raw
        if not _NAME.fullmatch(name):
            raise InvalidInput(
                f"secrets{whose}: {entry!r} is not a secret name (letters, digits and _, not starting with a digit; @NAME for a file)"
            )
        if name in seen:
            raise InvalidInput(f"secrets{whose}: {name} is declared twice")
        seen.add(name)
        found.append(DeclaredSecret(name=name, as_file=as_file))
    return found


def not_set(name: str, agent: str) -> str:
    """The reason an attempt fails with when a declared secret cannot be found."""
    return f"secret {name} is not set (declared by agent {agent})"


def crossing_note(secret: DeclaredSecret) -> str:
    """The trace line of a secret that crosses under another name."""
    return (
        f"secret {secret.name} crosses as {secret.env_name}: a name starting "
        f"{secret.name.upper().split('_', 1)[0]}_ belongs to {secret.reserved_by}, which a declared secret never replaces"
    )


def run_scope(tenant: str, run_id: str) -> str:
    """The redactor scope a run's secret values are held under (see `Redactor.hold`)."""
    return f"run:{tenant}/{run_id}"


def secret_file_folders(secret_env: Mapping[str, str]) -> list[str]:
    """The folders holding an attempt's `@NAME` files, from its `StepJob.secret_env`: what a
    sandbox that mounts a private /tmp binds in read-only so its programs can read them."""
    folders = {
        str(PurePosixPath(value).parent)
        for value in secret_env.values()
        if value.startswith("/") and PurePosixPath(value).parent.name.startswith(SECRET_FOLDER_PREFIX)
    }
    return sorted(folders)
