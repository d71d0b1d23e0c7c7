"""Declared secrets on this machine: `--secrets FILE` (dotenv), else the workspace's
`.secrets.env`, else the environment; and the private files `@NAME` secrets are given as.

One source answers for a run, the first that exists: a secrets file named is the only
place values come from (a name missing from it is missing, not looked up elsewhere), and
the environment is read only when neither file exists. The environment never gives a name
laneflow, the model's SDK or the AWS SDK reads for itself (`ANTHROPIC_*`, `LANEFLOW_*`,
`AWS_*`): a workspace's agent.md must not be able to ask for this machine's own keys; such a
secret comes from a file, where a person put it on purpose.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from laneflow.domain.errors import InvalidInput
from laneflow.domain.secrets import RESERVED_PREFIXES, SECRET_FOLDER_PREFIX

WORKSPACE_FILE = ".secrets.env"

_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def parse_dotenv(text: str, source: str) -> dict[str, str]:
    """A dotenv file's values: `NAME=value` lines (`export ` allowed), `#` comments and blank
    lines; a value bare (an inline ` #` starts a comment), in 'single quotes' (as written) or
    in "double quotes" (with \\n, \\t, \\" and \\\\ escapes; may span lines). A line that is none of
    these is `InvalidInput` naming the file and line, never quoting it (it may hold a value)."""
    values: dict[str, str] = {}
    lines = text.removeprefix("\ufeff").splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].lstrip()  # the right side may be inside quotes
        i += 1
        if not line.strip() or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if not match:
            raise InvalidInput(f"{source}, line {number}: not NAME=value")
        name, raw = match.groups()
        if raw.startswith('"'):
            body = raw[1:]
            while not _closed(body) and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            if not _closed(body):
                raise InvalidInput(f"{source}, line {number}: its double quote is never closed")
            end = _closing(body)
            if body[end + 1 :].strip() and not body[end + 1 :].strip().startswith("#"):
                raise InvalidInput(f"{source}, line {number}: text after the closing quote")
            values[name] = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), body[:end])
        elif raw.startswith("'"):
            end = raw.find("'", 1)
            if end < 0:
                raise InvalidInput(f"{source}, line {number}: its single quote is never closed")
            values[name] = raw[1:end]
        else:
            values[name] = re.split(r"\s+#", raw, maxsplit=1)[0].strip()
    return values


def _closing(body: str) -> int:
    """The index of the first unescaped double quote in `body`, or -1."""
    escaped = False
    for k, ch in enumerate(body):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return k
    return -1


def _closed(body: str) -> bool:
    return _closing(body) >= 0


def _reserved(name: str) -> bool:
    return name.upper().startswith(tuple(prefix for prefix, _ in RESERVED_PREFIXES))


class LocalSecrets:
    """`SecretSource` on this machine. `secrets_file` is `--secrets FILE` (None: not given);
    `environ` the environment to fall back on (none unless given: the wiring gives this
    process's, `laneflow.settings.environ`)."""

    def __init__(self, secrets_file: str | None = None, environ: Mapping[str, str] | None = None):
        self.secrets_file = secrets_file
        self.environ: Mapping[str, str] = {} if environ is None else environ

    def _file(self, workspace_uri: str) -> tuple[Path, str] | None:
        if self.secrets_file:
            return Path(self.secrets_file), "the --secrets file"
        if workspace_uri and "://" not in workspace_uri:
            candidate = Path(workspace_uri) / WORKSPACE_FILE
            if candidate.is_file():
                return candidate, f"the workspace's {WORKSPACE_FILE}"
        return None

    def where(self, workspace_uri: str) -> str:
        found = self._file(workspace_uri)
        return found[1] if found else "the environment"

    def read(self, tenant: str, workspace_uri: str, names: list[str]) -> dict[str, str]:
        found = self._file(workspace_uri)
        if found is None:
            return {n: self.environ[n] for n in names if n in self.environ and self.environ[n] and not _reserved(n)}
        path, what = found
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInput(f"{what} does not exist") from None
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInput(f"{what} cannot be read ({type(error).__name__})") from None
        values = parse_dotenv(text, what)
        return {n: values[n] for n in names if values.get(n)}


@dataclass
class PrivateFileSet:
    """Files of one attempt's `@NAME` secrets, in a 0700 folder of their own."""

    folder: Path
    paths: dict[str, str] = field(default_factory=dict)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class PrivateSecretFiles:
    """`SecretFiles` in the temp folder (never in a workspace or its scratch copy): a fresh
    0700 folder per attempt, one 0600 file per secret, named as the secret."""

    def __init__(self, root: str | None = None):
        self.root = root

    def write(self, values: dict[str, str]) -> PrivateFileSet:
        folder = Path(tempfile.mkdtemp(prefix=SECRET_FOLDER_PREFIX, dir=self.root))  # 0700
        files = PrivateFileSet(folder)
        try:
            for name, value in values.items():
                path = folder / name
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.fchmod(fd, 0o600)  # whatever the umask
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(value)
                files.paths[name] = str(path)
        except BaseException:
            files.remove()
            raise
        return files
