"""Reading a workspace from disk (README, "A workspace").

A workspace is a folder: `AGENTS.md` (settings in its frontmatter, shared instructions in
its body), `agents/<name>/` folders, `flows/*.yaml`, and shared `knowledge/`, `memory/`
and `state/`. A tenant may also have an account-level `AGENTS.md` whose settings fill the
gaps the workspace leaves, field by field.

Everything here reads afresh whenever a file changed, so an edited file is seen at once:
`load_workspace` reuses its last reading of a folder only while every file and folder it
read is unchanged (the same inode, size, modification and change times: a rewrite moves the
change time, which no one can set back), found with one listing of each folder; a step's
attempt reads its workspace this way in a fraction of a full read. (The parse of a file's
frontmatter is reused too, for the very same bytes: `frontmatter.read_front`.)

Problems are `errors.Problem`s with paths relative to the workspace (the account's
`AGENTS.md` shows as a relative path such as `../AGENTS.md`). A file that cannot be read
raises `WorkspaceInvalid` listing every problem found; warnings (a value read leniently,
an unknown setting) ride along on the returned models.

Here: the workspace itself (`load_workspace`) and its revision. Its files as the reader
lists them: workspace_files.py; the settings of its AGENTS.md and agent.md files:
workspace_settings.py; an agent: agent.py. Their models and `load_agent` are importable
from here too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr

from laneflow.domain.agent import Agent, Skill, has_agent, load_agent
from laneflow.domain.errors import Problem, WorkspaceInvalid
from laneflow.domain.frontmatter import read_front, read_frontmatter
from laneflow.domain.mcp import check_mcp
from laneflow.domain.workspace_files import (
    SKIP_DIRS,
    Doc,
    Readings,
    agent_md,
    folder_marks,
    mark,
    read_docs,
    rel_path,
    visible_files,
)
from laneflow.domain.workspace_settings import AgentSettings, WorkspaceSettings, merge_settings, read_settings, stub_problems

__all__ = [
    "AgentSettings",
    "WorkspaceSettings",
    "Doc",
    "Skill",
    "Agent",
    "Workspace",
    "load_workspace",
    "load_agent",
    "has_agent",
    "workspace_revision",
    "read_frontmatter",
]


class Workspace(BaseModel):
    """A workspace's settings, shared documents and the names of its agents and flows.

    Agents and flows are only listed here; `load_agent` and `flow.load_flow` read them."""

    root: Path  # absolute
    name: str  # the folder name
    account_root: Path | None = None
    settings: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    instructions: list[Doc] = Field(default_factory=list)  # account body first, then the workspace's
    knowledge: list[Doc] = Field(default_factory=list)
    memory: list[Doc] = Field(default_factory=list)
    state: list[Doc] = Field(default_factory=list)
    agent_names: list[str] = Field(default_factory=list)
    flow_names: list[str] = Field(default_factory=list)
    warnings: list[Problem] = Field(default_factory=list)
    # What `load_workspace` read it from (`_signature`), None for a reading of its own.
    _reading: tuple[object, ...] | None = PrivateAttr(default=None)


def _account_file(root: Path, account: str | Path | None) -> Path | None:
    """The account-level AGENTS.md: the one passed, else the workspace's parent's, if any."""
    if account is None:
        candidate = root.parent / "AGENTS.md"
        return candidate if candidate.is_file() else None
    path = Path(account).expanduser()
    if path.is_dir():
        path = path / "AGENTS.md"
    if not path.is_file():
        raise WorkspaceInvalid(f"no account AGENTS.md at {account}")
    return path.resolve()


def _read_agents_md(
    path: Path, account_md: Path | None, errors: list[Problem], warnings: list[Problem]
) -> tuple[list[WorkspaceSettings | None], list[Doc]]:
    """The account's and the workspace's AGENTS.md: each one's settings (None when it is
    absent or cannot be read) and body, its problems collected."""
    instructions: list[Doc] = []
    layers: list[WorkspaceSettings | None] = []
    for md in (account_md, path / "AGENTS.md"):
        if md is None or not md.is_file():
            layers.append(None)
            continue
        rel = rel_path(md, path)
        try:
            front = read_front(md, rel)
        except WorkspaceInvalid as e:
            errors.extend(e.problems)
            layers.append(None)
            continue
        errors.extend(front.errors)
        warnings.extend(front.warnings)
        settings, errs, warns = read_settings(WorkspaceSettings, front, rel)
        errors.extend(errs)
        warnings.extend(warns)
        if settings is not None and settings.judge:
            errors.extend(stub_problems(settings.judge.get("stub"), front, rel, "judge.stub"))
        listed = front.data.get("mcp")  # not a list: the settings' own check says so
        errors.extend(check_mcp(listed if isinstance(listed, list) else None, rel=rel, lines=front.lines, secrets=None)[1])
        layers.append(settings)
        if front.body.strip():
            instructions.append(Doc(path=rel, text=front.body))
    return layers, instructions


def _agent_names(path: Path, warnings: list[Problem]) -> list[str]:
    """The agents of a workspace: its `agents/` folders with an agent.md (a folder without
    one is a warning)."""
    agents_dir = path / "agents"
    agent_names = []
    if agents_dir.is_dir():
        for d in sorted(agents_dir.iterdir()):
            if not d.is_dir() or d.name.startswith(".") or d.name in SKIP_DIRS:
                continue
            if agent_md(path, d.name):
                agent_names.append(d.name)
            else:
                warnings.append(
                    Problem(
                        file=rel_path(d, path),
                        severity="warning",
                        message="folder has no agent.md; it is not an agent",
                    )
                )
    return agent_names


def _flow_names(path: Path, warnings: list[Problem]) -> list[str]:
    """The flows of a workspace: `flows/*.yaml` (a `.yml` file is a warning)."""
    flow_names = [p.stem for p in visible_files(path / "flows", "*.yaml")]
    for p in visible_files(path / "flows", "*.yml"):
        warnings.append(
            Problem(
                file=rel_path(p, path),
                severity="warning",
                message=f"flows end in .yaml; rename it to {p.stem}.yaml to use it",
            )
        )
    return flow_names


def _read_workspace(root: str | Path, account: str | Path | None) -> tuple[Workspace, list[Problem]]:
    """Read a workspace, collecting the errors of its AGENTS.md files rather than raising.

    Raises `WorkspaceInvalid` only when there is no workspace to read at all."""
    given = root
    path = Path(root).expanduser()
    if not path.is_dir():
        raise WorkspaceInvalid(f"no workspace at {given} (folder not found)")
    path = path.resolve()
    if not any((path / n).exists() for n in ("AGENTS.md", "agents", "flows")):
        raise WorkspaceInvalid(f"{given} is not a laneflow workspace (no AGENTS.md, agents/ or flows/)")

    errors: list[Problem] = []
    warnings: list[Problem] = []
    account_md = _account_file(path, account)
    layers, instructions = _read_agents_md(path, account_md, errors, warnings)
    agent_names = _agent_names(path, warnings)
    flow_names = _flow_names(path, warnings)

    ws = Workspace(
        root=path,
        name=path.name,
        account_root=account_md.parent if account_md else None,
        settings=merge_settings(layers[0], layers[1] or WorkspaceSettings()),
        instructions=instructions,
        knowledge=read_docs(path / "knowledge", path, "*.md", warnings),
        memory=read_docs(path / "memory", path, "*.md", warnings),
        state=read_docs(path / "state", path, "*", warnings),
        agent_names=agent_names,
        flow_names=flow_names,
        warnings=warnings,
    )
    return ws, errors


# The folders a reading lists (their entries are what it reads), and how many readings are kept.
_READ_FOLDERS = ("agents", "flows", "knowledge", "memory", "state")
_READINGS_KEPT = 16
_readings: Readings[Workspace] = Readings(_READINGS_KEPT)


def _signature(path: Path, account: str | Path | None) -> tuple[object, ...]:
    """What a reading of the workspace depends on: each AGENTS.md it may read, and every entry
    of the folders it lists (each agent's agent.md too), as `mark`s."""
    root = str(path)
    marks: list[object] = [mark(root + "/AGENTS.md"), mark(str(path.parent / "AGENTS.md"))]
    if account is not None:
        given = Path(account).expanduser()
        marks += [str(given), mark(given), mark(given / "AGENTS.md")]
    for folder in _READ_FOLDERS:
        listed = folder_marks(f"{root}/{folder}")
        marks.append(listed)
        if folder == "agents":
            marks += [mark(f"{root}/agents/{entry[0]}/agent.md") for entry in listed[1:] if isinstance(entry, tuple)]
    return tuple(marks)


def load_workspace(root: str | Path, account: str | Path | None = None) -> Workspace:
    """`read_workspace`, reusing the last reading of the folder while nothing it read changed
    (the module docstring). Each caller gets a model of its own."""
    path = Path(root).expanduser()
    try:
        path = path.resolve()
    except OSError:
        return read_workspace(root, account)

    def reader(signature: tuple[object, ...]) -> Workspace:
        ws = read_workspace(root, account)
        ws._reading = signature  # `load_agent` reuses its readings of this reading's agents
        return ws

    return _readings.read((str(path), str(account)), lambda: _signature(path, account), reader)


def read_workspace(root: str | Path, account: str | Path | None = None) -> Workspace:
    """Read a workspace folder: settings (the workspace's over the account's, field by
    field), shared instructions, knowledge, memory and state, and the names of its agents
    and flows.

    `account` is a folder holding the account-level AGENTS.md (or that file); without it,
    the workspace's parent folder is used when it has an AGENTS.md.

    Raises `WorkspaceInvalid` when the folder is missing or is not a workspace (no
    AGENTS.md, agents/ or flows/), or when an AGENTS.md cannot be read."""
    ws, errors = _read_workspace(root, account)
    if errors:
        raise WorkspaceInvalid(f"workspace {ws.name!r} has problems in AGENTS.md", errors)
    return ws


def workspace_revision(root: str | Path) -> str:
    """A content hash of the workspace's files: `sha256:<hex>`.

    Covers every file's relative path and bytes, in sorted order; skips dotfiles and
    dot-folders, `.git`, `__pycache__`, `outputs/` and `storage/` (what runs write). A run
    computes it once as it starts and keeps it."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise WorkspaceInvalid(f"no workspace at {root} (folder not found)")
    files: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        for n in names:
            if not n.startswith("."):
                full = Path(folder) / n
                files.append((rel_path(full, path), full))
    digest = hashlib.sha256()
    for rel, full in sorted(files):
        data = full.read_bytes()
        # Length-prefixed, so no two different workspaces hash the same byte stream.
        name = rel.encode("utf-8")
        digest.update(len(name).to_bytes(8, "big") + name)
        digest.update(len(data).to_bytes(8, "big") + data)
    return "sha256:" + digest.hexdigest()
