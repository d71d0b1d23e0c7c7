"""A workspace's files as the reader sees them: the folders it skips, a file's path relative to
the workspace, the visible files of a folder, a folder's text documents (`Doc`), and where an
agent's agent.md is."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from pydantic import BaseModel

from laneflow.domain.errors import Problem, WorkspaceInvalid
from laneflow.domain.frontmatter import read_text


class Doc(BaseModel):
    """A text file of the workspace: its path (relative to the workspace, posix) and text."""

    path: str
    text: str


SKIP_DIRS = {".git", "__pycache__", "outputs", "storage"}


def rel_path(path: Path, root: Path) -> str:
    text, base = str(path), str(root)
    if text.startswith(base + os.sep):  # a file of the workspace: its tail (a step reads a dozen)
        return text[len(base) + 1 :].replace(os.sep, "/")
    return Path(os.path.relpath(path, root)).as_posix()


def visible_files(folder: Path, pattern: str = "*") -> list[Path]:
    """The visible files directly in a folder matching a glob, sorted by name (a folder that
    is missing or cannot be listed has none)."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(
                e.name for e in entries if not e.name.startswith(".") and fnmatch.fnmatchcase(e.name, pattern) and e.is_file()
            )
    except OSError:
        return []
    return [folder / name for name in names]


def read_docs(folder: Path, root: Path, pattern: str, warnings: list[Problem]) -> list[Doc]:
    """Text documents of a folder. A file that is not UTF-8 is left out with a warning."""
    docs = []
    for path in visible_files(folder, pattern):
        rel = rel_path(path, root)
        try:
            text = read_text(path, rel)
        except WorkspaceInvalid as e:
            warnings.extend(p.model_copy(update={"severity": "warning", "message": p.message + "; left out"}) for p in e.problems)
            continue
        docs.append(Doc(path=rel, text=text))
    return docs


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def agent_md(root: Path, name: str) -> Path | None:
    if not isinstance(name, str) or not _NAME.match(name):
        return None
    path = root / "agents" / name / "agent.md"
    return path if path.is_file() else None
