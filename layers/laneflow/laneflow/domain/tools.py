"""The tools an agent may be given (agent.md `tools:`), by name: the file tools, `bash`, and
the script tools, one per executable in the agent's and the workspace's `scripts/`.

- `script_<stem>`: characters of the stem outside `[A-Za-z0-9_-]` become `_`; an agent's own
  script wins over a workspace script of the same name. A script is described by its
  leading comment lines (after a `#!` line), and takes `{"args": [...], "stdin": "..."}`.
- `tools: [scripts]` grants every script tool, `tools: [script_count]` one.
- An empty `tools:` grants the file tools only (what a step had before programs existed).
- `search` and `history` are the finding tools (`adapters/executors/finding.py`): lines of the
  step's workspace copy, and the conclusions of the workspace's earlier runs.
- `web_search` and `web_fetch` are Anthropic's server tools (`adapters/executors/web.py`):
  definitions in the request, run by the API, each used at most the agent's `web_max_uses`
  times a request (a model turn).

This is what `laneflow check`, the prompt and the tool registry all read, so the three
cannot disagree about which tools a step has.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from laneflow.domain.inbox import ASK, PEERS

FILE_TOOLS = ("list_files", "read_file", "write_file")

BASH = "bash"

ALL_SCRIPTS = "scripts"  # grants every script tool

SCRIPT_PREFIX = "script_"

COLLEAGUE_GRANTS = (PEERS, ASK)  # peers_list and peers_message; ask (laneflow.domain.inbox)

SEARCH = "search"  # lines of the step's workspace copy

HISTORY = "history"  # the conclusions of the workspace's earlier runs

FINDING_TOOLS = (HISTORY, SEARCH)

WEB_SEARCH = "web_search"  # Anthropic's server tools: run by the API, never by laneflow

WEB_FETCH = "web_fetch"

WEB_TOOLS = (WEB_FETCH, WEB_SEARCH)

DEFAULT_WEB_MAX_USES = 5  # agent.md `web_max_uses`: each web tool's uses a request (a model turn)

PROGRAM_TOOLS = (BASH,)  # besides the script tools: what runs a program in the sandbox

MAX_DESCRIPTION_CHARS = 1_000

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class ScriptTool:
    """An executable in a `scripts/` folder, offered as the tool `name`."""

    name: str
    path: str  # relative to the workspace (posix)
    description: str


def script_tool_name(stem: str) -> str:
    return SCRIPT_PREFIX + _UNSAFE.sub("_", stem)


def _description(path: Path) -> str:
    """The leading comment lines of a script (a `#!` line skipped), as one text."""
    lines: list[str] = []
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            head = f.read(8_192)
    except OSError:
        return ""
    for number, line in enumerate(head.splitlines()):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if stripped.startswith("#"):
            lines.append(stripped.lstrip("#").strip())
        elif stripped or lines:
            break
    return " ".join(part for part in lines if part)[:MAX_DESCRIPTION_CHARS]


def _executables(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and os.access(p, os.X_OK))


def discover_scripts(root: str | Path, agent_path: str) -> list[ScriptTool]:
    """Every script tool of an agent: its own `scripts/` first, then the workspace's, each
    name once (the agent's wins), in name order."""
    root = Path(root)
    found: dict[str, ScriptTool] = {}
    for folder in (root / agent_path / "scripts", root / "scripts"):
        for path in _executables(folder):
            name = script_tool_name(path.stem)
            if name not in found:
                rel = path.relative_to(root).as_posix()
                found[name] = ScriptTool(name=name, path=rel, description=_description(path))
    return [found[name] for name in sorted(found)]


def granted(tools: list[str] | tuple[str, ...], scripts: list[ScriptTool]) -> tuple[list[str], list[ScriptTool]]:
    """What `tools:` grants: (the file tools and `bash`, in name order; the script tools)."""
    if not tools:
        return list(FILE_TOOLS), []
    named = set(tools)
    plain = sorted(n for n in named if n in FILE_TOOLS or n == BASH)
    chosen = [s for s in scripts if ALL_SCRIPTS in named or s.name in named]
    return plain, chosen


def grants_scripts(tools: list[str] | tuple[str, ...]) -> bool:
    """Whether `tools:` could grant a script tool (`scripts`, or a name of one)."""
    return any(t == ALL_SCRIPTS or t.startswith(SCRIPT_PREFIX) for t in tools)


def runs_programs(tools: list[str] | tuple[str, ...]) -> bool:
    """Whether `tools:` grants anything that runs a program (bash or a script tool)."""
    return BASH in tools or grants_scripts(tools)


def web_tools(tools: list[str] | tuple[str, ...]) -> list[str]:
    """The web tools `tools:` grants, in name order."""
    return sorted(set(tools) & set(WEB_TOOLS))


def unknown_tools(tools: list[str], scripts: list[ScriptTool]) -> list[tuple[int, str, str]]:
    """The names in `tools:` that name no tool: (index, name, a suggestion or "")."""
    known = [*FILE_TOOLS, BASH, ALL_SCRIPTS, *COLLEAGUE_GRANTS, *FINDING_TOOLS, *WEB_TOOLS, *(s.name for s in scripts)]
    found = []
    for index, name in enumerate(tools):
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        found.append((index, name, close[0] if close else ""))
    return found
