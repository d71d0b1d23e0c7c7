"""The file tools a Claude step can use: list, read and write files inside its own agent
folder and the workspace's shared folders. Paths are relative to the workspace; nothing
outside those folders can be reached (no absolute paths, no `..`, no symlink escapes).
Knowledge is reference material: readable, never written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHARED = ("knowledge", "memory", "state", "storage")
READ_ONLY = ("knowledge",)
MAX_READ_CHARS = 200_000


class ToolError(Exception):
    """A tool call that cannot be done; its message goes back to the model as an error."""


class FileTools:
    def __init__(self, workspace_root: str | Path, agent_path: str):
        self.root = Path(workspace_root).resolve()
        self.agent_path = agent_path.strip("/")

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
                "description": f"Write a text file (replacing it) in your own folder, or in memory/, state/ or storage/.",
                "input_schema": {
                    "type": "object",
                    "properties": {"path": path, "content": {"type": "string"}},
                    "required": ["path", "content"],
                },
            },
        }
        names = sorted(name for name in defs if not allowed or name in allowed)
        return [defs[name] for name in names]

    def _resolve(self, rel: Any, *, write: bool = False) -> Path:
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty string relative to the workspace")
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ToolError(f"{rel}: paths are relative to the workspace and stay inside it")
        target = (self.root / rel).resolve()
        try:
            parts = target.relative_to(self.root).parts
        except ValueError:
            raise ToolError(f"{rel}: outside the workspace") from None
        own = tuple(self.agent_path.split("/"))
        in_own = parts[: len(own)] == own
        in_shared = bool(parts) and parts[0] in SHARED
        if not (in_own or in_shared):
            raise ToolError(f"{rel}: not in your folder ({self.agent_path}/) or a shared folder")
        if write and ((in_shared and parts[0] in READ_ONLY) or (in_own and parts[len(own) : len(own) + 1] == ("knowledge",))):
            raise ToolError(f"{rel}: knowledge is read-only")
        return target

    def run(self, name: str, args: dict[str, Any]) -> str:
        if name == "list_files":
            folder = self._resolve(args.get("path", ""))
            if not folder.is_dir():
                raise ToolError(f"{args.get('path')}: no such folder")
            files = sorted(p.relative_to(self.root).as_posix() for p in folder.rglob("*") if p.is_file())
            return "\n".join(files) or "(empty)"
        if name == "read_file":
            path = self._resolve(args.get("path", ""))
            if not path.is_file():
                raise ToolError(f"{args.get('path')}: no such file")
            text = path.read_text(encoding="utf-8", errors="replace")
            return text if len(text) <= MAX_READ_CHARS else text[:MAX_READ_CHARS] + "\n[truncated]"
        if name == "write_file":
            path = self._resolve(args.get("path", ""), write=True)
            content = args.get("content")
            if not isinstance(content, str):
                raise ToolError("content must be a string")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            return f"wrote {len(content)} characters to {path.relative_to(self.root).as_posix()}"
        raise ToolError(f"no tool {name!r}")
