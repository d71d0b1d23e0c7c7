"""A workspace's files as the reader sees them: the folders it skips, a file's path relative to
the workspace, the visible files of a folder, a folder's text documents (`Doc`), and where an
agent's agent.md is."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from laneflow.domain.errors import Problem, WorkspaceInvalid
from laneflow.domain.frontmatter import read_text


class Doc(BaseModel):
    """A text file of the workspace: its path (relative to the workspace, posix) and text."""

    path: str
    text: str


SKIP_DIRS = {".git", "__pycache__", "outputs", "storage"}

Mark = tuple[int, int, int, int]


def mark(path: str | os.PathLike[str]) -> Mark | None:
    """What says a file or folder changed: its inode, size, modification and change times (a
    rewrite moves the change time, which no one can set back); None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# A reading is kept only once everything it read is this much older than the reading: a
# file system whose clock is coarse (a second, two on FAT) could otherwise rewrite a file,
# keeping its size, within one tick of the reading and look unchanged (git's "racily clean").
SETTLED_NS = 2_000_000_000


def settled(marks: object, now_ns: int) -> bool:
    """Whether every `mark` in `marks` (nested as `folder_marks` nests them) changed at least
    SETTLED_NS before `now_ns`."""
    if isinstance(marks, tuple):
        if len(marks) == 4 and all(type(x) is int for x in marks):
            return bool(marks[3] <= now_ns - SETTLED_NS)
        return all(settled(each, now_ns) for each in marks)
    return True


_M = TypeVar("_M", bound=BaseModel)


class Readings(Generic[_M]):
    """The last readings of some folders (at most `kept`, the least recently used let go),
    each reused while what it read has the same `signature` (`mark`s of its files and
    folders): one taken before reading, the same again after it, and `settled`."""

    def __init__(self, kept: int):
        self.kept = kept
        self._kept: OrderedDict[object, tuple[tuple[object, ...], _M]] = OrderedDict()
        self._lock = threading.Lock()

    def read(
        self,
        key: object,
        signature: Callable[[], tuple[object, ...]],
        reader: Callable[[tuple[object, ...]], _M],
    ) -> _M:
        """The kept reading for `key` while its signature holds, else `reader(signature)`'s
        (kept when nothing changed while it read). Each caller gets a model of its own (its
        lists are shared: a reading is read, never changed, by its callers)."""
        before = signature()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == before:
                self._kept.move_to_end(key)
                return kept[1].model_copy()
        value = reader(before)
        if signature() == before and settled(before, time.time_ns()):
            with self._lock:
                self._kept[key] = (before, value)
                while len(self._kept) > self.kept:
                    self._kept.popitem(last=False)
        return value.model_copy()

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


def folder_marks(folder: str, *, below: bool = False) -> tuple[object, ...]:
    """The `mark` of a folder and of each of its entries, by name; with `below`, of every
    folder under it too (dot-folders and SKIP_DIRS left out: nothing is read from them)."""
    found: list[object] = [mark(folder)]
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError:
        return tuple(found)
    for entry in entries:
        found.append((entry.name, mark(entry.path)))
        if below and entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".") and entry.name not in SKIP_DIRS:
            found.append(folder_marks(entry.path, below=True))
    return tuple(found)


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
