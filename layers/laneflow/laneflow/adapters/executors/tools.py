"""The file tools a Claude step can use: list, read and write files inside its own agent
folder and the workspace's shared folders. Paths are relative to the workspace; nothing
outside those folders can be reached (no absolute paths, no `..`, no symlink escapes).
Knowledge is reference material: readable, never written. An agent's definition (its
`agent.md`, `skills/` and `scripts/`) is readable, never written: an agent cannot rewrite
itself, and another agent's folder cannot be reached at all.

A tool call that cannot be done, for any reason of its own (a refused or malformed path, a
folder given for a file, a symlink loop, a file that is not UTF-8 text, missing or ill-typed
arguments, an error of the file system), is a `ToolError`: its message goes back to the
model as an `is_error` result, and the step goes on. A message names the path as the model
gave it, never a local absolute path.
"""

from __future__ import annotations

import codecs
import errno
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

log = logging.getLogger("laneflow.tools")


SHARED = ("knowledge", "memory", "state", "storage")

READ_ONLY = ("knowledge",)

DEFINITION = ("agent.md", "skills", "scripts")  # inside an agent's folder: what it is, not what it made

MAX_READ_CHARS = 200_000

MAX_READ_BYTES = 4 * MAX_READ_CHARS  # a UTF-8 character is at most 4 bytes

MAX_PATH_CHARS = 1024

MAX_NAME_BYTES = 255  # what file systems take for one name

MAX_LISTED = 2_000


# What an OSError means, said without the file name it carries (a local absolute path).
_OS_REASONS = {
    errno.ENOENT: "no such file or folder",
    errno.EISDIR: "it is a folder",
    errno.ENOTDIR: "a folder on the way is a file",
    errno.EEXIST: "a folder on the way is a file",
    errno.ELOOP: "a symlink loop",
    errno.ENAMETOOLONG: "a name in it is too long",
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted",
    errno.ENOSPC: "the disk is full",
    errno.EROFS: "the file system is read-only",
}


class ToolError(Exception):
    """A tool call that cannot be done; its message goes back to the model as an error."""


def _shown(rel: str) -> str:
    """The path as the model gave it, cut short and with control characters escaped, for a message."""
    text = rel if len(rel) <= 120 else rel[:100] + f"… ({len(rel)} characters)"
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return _OS_REASONS.get(exc.errno or 0) or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)
    return type(exc).__name__


class FileTools:
    def __init__(self, workspace_root: str | Path, agent_path: str):
        self.root = Path(workspace_root).resolve()
        self.agent_path = agent_path.strip("/")
        self._own = tuple(self.agent_path.split("/"))
        self._tools: dict[str, Callable[[dict[str, Any]], str]] = {
            "list_files": self._list_files,
            "read_file": self._read_file,
            "write_file": self._write_file,
        }

    # The definitions, in a stable order (they are part of the cached prompt prefix).
    def definitions(self, allowed: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        path = {"type": "string", "description": "a path relative to the workspace, e.g. storage/brief.md"}
        defs = {
            "list_files": {
                "name": "list_files",
                "description": f"List the files under a folder: your own folder ({self.agent_path}/) or a shared one ({', '.join(s + '/' for s in SHARED)}).",
                "input_schema": {"type": "object", "properties": {"path": path}, "required": ["path"]},
            },
            "read_file": {
                "name": "read_file",
                "description": "Read a text file from your own folder or a shared folder.",
                "input_schema": {"type": "object", "properties": {"path": path}, "required": ["path"]},
            },
            "write_file": {
                "name": "write_file",
                "description": (
                    "Write a text file (replacing it) in your own folder, or in memory/, state/ or storage/. "
                    "knowledge/ and your definition (agent.md, skills/, scripts/) are read-only."
                ),
                "input_schema": {
                    "type": "object",
                    "properties": {"path": path, "content": {"type": "string"}},
                    "required": ["path", "content"],
                },
            },
        }
        names = sorted(name for name in defs if not allowed or name in allowed)
        return [defs[name] for name in names]

    def run(self, name: str, args: Any) -> str:
        """Do one tool call and return its output; any failure of the call is a ToolError."""
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError(f"no tool {name!r}; the file tools are {', '.join(sorted(self._tools))}")
        if not isinstance(args, dict):
            raise ToolError(f"{name} takes a JSON object of arguments, not {type(args).__name__}")
        try:
            return tool(args)
        except ToolError:
            raise
        except Exception as exc:  # a tool's own failure is the model's to hear, never a crashed step
            log.warning("%s failed: %s", name, type(exc).__name__, exc_info=not isinstance(exc, OSError))
            raise ToolError(f"{name} failed: {_reason(exc)}") from None

    # -- where a path may lead ----------------------------------------------------------------

    def _resolve(self, rel: Any, *, write: bool = False) -> tuple[Path, str]:
        """The file or folder `rel` names, if this agent may reach it (and write it); and the
        path as shown in messages."""
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty string relative to the workspace, e.g. storage/brief.md")
        shown = _shown(rel)
        if "\x00" in rel:
            raise ToolError(f"{shown}: a path cannot hold a NUL character")
        try:
            names = [part.encode("utf-8") for part in rel.split("/")]
        except UnicodeEncodeError:
            raise ToolError(f"{shown}: not a valid text path (a lone surrogate)") from None
        if len(rel) > MAX_PATH_CHARS or any(len(n) > MAX_NAME_BYTES for n in names):
            raise ToolError(f"{shown}: too long (at most {MAX_PATH_CHARS} characters, {MAX_NAME_BYTES} bytes a name)")
        if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
            raise ToolError(f"{shown}: paths are relative to the workspace and stay inside it")
        try:
            target = (self.root / rel).resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (its text holds the local path)
            raise ToolError(f"{shown}: a symlink loop, or a link that cannot be followed") from None
        why = self._refused(target, write=write)
        if why:
            raise ToolError(f"{shown}: {why}")
        return target, shown

    def may_read(self, target: Path) -> bool:
        """Whether this agent may read `target`, a resolved path (as `read_file` would)."""
        return self._refused(target, write=False) is None

    def _refused(self, target: Path, *, write: bool) -> str | None:
        """Why this agent may not reach (or write) `target`, a resolved path; None if it may."""
        try:
            parts = target.relative_to(self.root).parts
        except ValueError:
            return "outside the workspace"
        own = self._own
        in_own = parts[: len(own)] == own
        if not in_own and not (parts and parts[0] in SHARED):
            return f"not in your folder ({self.agent_path}/) or a shared folder"
        if not write:
            return None
        # The first name below the agent's folder (or the shared folder's own name), compared
        # case-blind: on a case-insensitive file system Agent.MD is agent.md.
        inner = parts[len(own) :] if in_own else parts
        first = inner[0].casefold() if inner else ""
        if in_own and first in DEFINITION:
            return "an agent's definition (agent.md, skills/, scripts/) is read-only: an agent cannot rewrite itself"
        if first in READ_ONLY:
            return "knowledge is read-only"
        return None

    # -- the tools ------------------------------------------------------------------------------

    def _list_files(self, args: dict[str, Any]) -> str:
        folder, shown = self._resolve(args.get("path"))
        if not folder.exists():
            raise ToolError(f"{shown}: no such folder")
        if not folder.is_dir():
            raise ToolError(f"{shown}: a file, not a folder (read it with read_file)")
        files: list[str] = []
        more = False
        for here, dirs, names in os.walk(folder):  # never follows a linked folder; skips unreadable ones
            dirs.sort()
            for name in sorted(names):
                path = Path(here, name)
                try:
                    if not path.is_file() or self._refused(path.resolve(), write=False):
                        continue  # only what read_file would read
                except (OSError, RuntimeError):
                    continue
                if len(files) == MAX_LISTED:
                    more = True
                    break
                files.append(path.relative_to(self.root).as_posix())
            if more:
                break
        listing = "\n".join(sorted(files)) or "(empty)"
        return listing + (f"\n[stopped at {MAX_LISTED} files: list a narrower folder]" if more else "")

    def _read_file(self, args: dict[str, Any]) -> str:
        path, shown = self._resolve(args.get("path"))
        if path.is_dir():
            raise ToolError(f"{shown}: a folder, not a file (list it with list_files)")
        if not path.exists():
            raise ToolError(f"{shown}: no such file")
        if not path.is_file():
            raise ToolError(f"{shown}: not a regular file")
        with path.open("rb") as f:
            data = f.read(MAX_READ_BYTES + 1)
        cut = len(data) > MAX_READ_BYTES
        try:
            # Incremental, so a character cut at the byte limit is not taken for bad text.
            text = codecs.getincrementaldecoder("utf-8")().decode(data[:MAX_READ_BYTES], final=not cut)
        except UnicodeDecodeError as exc:
            raise ToolError(f"{shown}: not UTF-8 text (byte {exc.start} is not); read_file reads text files") from None
        if cut or len(text) > MAX_READ_CHARS:
            return text[:MAX_READ_CHARS] + "\n[truncated]"
        return text

    def _write_file(self, args: dict[str, Any]) -> str:
        path, shown = self._resolve(args.get("path"), write=True)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolError("content must be a string: the file's text")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError("content is not valid text (it holds a lone surrogate)") from None
        if path.is_dir():
            raise ToolError(f"{shown}: a folder, not a file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ToolError(f"{shown}: a folder on the way is a file") from None
        # Written beside it and renamed over it: an interrupted write never leaves half a file.
        scratch = path.with_name(f".laneflow-{uuid.uuid4().hex[:12]}.tmp")
        try:
            scratch.write_bytes(data)
            os.replace(scratch, path)
        finally:
            scratch.unlink(missing_ok=True)
        return f"wrote {len(content)} characters to {path.relative_to(self.root).as_posix()}"
