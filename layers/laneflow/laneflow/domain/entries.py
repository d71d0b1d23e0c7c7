"""What the list settings of agent.md whose entries name declared secrets have in common
(`apis:`, `mcp:`): how a `${NAME}` in a header or an env value is written and filled, and
how a problem of an entry is named (`SETTING[i].KEY`, with its line) and an unknown key
refused with the closest one."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneflow.domain.errors import Problem

SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # `${NAME}`: a declared secret, filled at call time


def fill_secrets(values: dict[str, str], secrets: dict[str, str]) -> dict[str, str]:
    """`values` with each `${NAME}` filled from `secrets` (NAME -> value). Raises `KeyError`
    naming a secret that is not given."""

    def fill(match: re.Match[str]) -> str:
        return secrets[match.group(1)]

    return {name: SECRET_REF.sub(fill, value) for name, value in values.items()}


@dataclass
class EntryProblems:
    """The problems of one list setting's entries, each named `SETTING[i].KEY` with its line
    (that of the key, else the entry's, else the setting's)."""

    setting: str  # "apis", "mcp"
    rel: str  # the file, relative to the workspace
    lines: dict[str, int]
    problems: list[Problem]

    def error(self, index: int, field: str, message: str) -> None:
        where = f"{self.setting}[{index}]" + (f".{field}" if field else "")
        line = self.lines.get(where, self.lines.get(f"{self.setting}[{index}]", self.lines.get(self.setting)))
        self.problems.append(Problem(file=self.rel, line=line, field=where, message=message))

    def unknown_keys(self, index: int, raw: dict[Any, Any], keys: Sequence[str], what: str) -> None:
        """Each key of `raw` not in `keys`, refused with the closest one (`what`: "an API")."""
        for key in raw:
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(index, str(key), f"unknown key {key!r}{hint}; {what} takes {', '.join(keys)}")
