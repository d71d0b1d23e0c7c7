"""Reading a workspace from disk (README, "A workspace").

A workspace is a folder: `AGENTS.md` (settings in its frontmatter, shared instructions in
its body), `agents/<name>/` folders, `flows/*.yaml`, and shared `knowledge/`, `memory/`
and `state/`. A tenant may also have an account-level `AGENTS.md` whose settings fill the
gaps the workspace leaves, field by field.

Everything here reads afresh on every call: every file is read from disk each time, so the
same bytes always give the same result, and an edited file is seen at once. (Only the parse
of a file's frontmatter is reused, for the very same bytes: `frontmatter.read_front`.)

Problems are `errors.Problem`s with paths relative to the workspace (the account's
`AGENTS.md` shows as a relative path such as `../AGENTS.md`). A file that cannot be read
raises `WorkspaceInvalid` listing every problem found; warnings (a value read leniently,
an unknown setting) ride along on the returned models.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from laneflow.domain.apis import API_PREFIX, ApiSpec, check_apis
from laneflow.domain.errors import InvalidInput, Problem, WorkspaceInvalid
from laneflow.domain.frontmatter import Front, read_front, read_frontmatter, read_text, type_name
from laneflow.domain.inbox import ASK, ASK_TIMEOUT_BOUNDS, DEFAULT_ASK_TIMEOUT_S
from laneflow.domain.pricing import catalog
from laneflow.domain.secrets import declared_secrets
from laneflow.domain.stub_answers import header_problems
from laneflow.domain.tools import ScriptTool, discover_scripts, runs_programs, unknown_tools

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


# --------------------------------------------------------------------------- models


class AgentSettings(BaseModel):
    """The frontmatter of `agents/<name>/agent.md`. Every field is optional."""

    # Strict: YAML already gives typed values, so "30" for a number is a mistake to report,
    # not a string to coerce. (Strict pydantic still takes an int for a float.)
    model_config = ConfigDict(strict=True, extra="ignore", protected_namespaces=())

    model: str | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    tools: list[str] = Field(default_factory=list)
    budget: float | None = Field(default=None, gt=0, description="USD cap for one step")
    timeout: float | None = Field(default=None, gt=0, description="seconds")
    ask_timeout: float = Field(
        default=DEFAULT_ASK_TIMEOUT_S, ge=ASK_TIMEOUT_BOUNDS[0], le=ASK_TIMEOUT_BOUNDS[1], description="seconds"
    )
    max_turns: int | None = Field(default=None, ge=1)
    sandbox: bool = False
    size: Literal["small", "medium", "large"] | None = None
    secrets: list[str] = Field(default_factory=list)
    apis: list[Any] = Field(default_factory=list)  # checked into `Agent.apis` (domain/apis.py)
    stub: str | list[str] | None = None
    description: str | None = None


class WorkspaceSettings(BaseModel):
    """The frontmatter of `AGENTS.md`: the workspace's, else the account's, field by field."""

    model_config = ConfigDict(strict=True, extra="ignore", protected_namespaces=())

    model: str | None = None
    capture: Literal["full", "metadata"] = "full"
    judge: dict[str, Any] | None = None  # {model, effort} for `verify: judge`
    network_enforce: bool | None = None
    budget: float | None = Field(default=None, gt=0)
    locale: str | None = None


JUDGE_FIELDS = ("model", "effort", "stub")  # stub: the judge's answers on the stub model


class Doc(BaseModel):
    """A text file of the workspace: its path (relative to the workspace, posix) and text."""

    path: str
    text: str


class Skill(BaseModel):
    """An agent skill: `skills/<skill>/SKILL.md` or a flat `skills/<name>.md`."""

    name: str
    description: str
    path: str


class Agent(BaseModel):
    """An agent as read from `agents/<name>/`, parsed afresh by `load_agent`."""

    model_config = ConfigDict(protected_namespaces=())

    name: str
    path: str  # "agents/<name>"
    settings: AgentSettings
    persona: str
    skills: list[Skill] = Field(default_factory=list)
    memory: list[Doc] = Field(default_factory=list)
    knowledge: list[Doc] = Field(default_factory=list)
    scripts: list[str] = Field(default_factory=list)  # relative paths
    script_tools: list[ScriptTool] = Field(default_factory=list)  # its own and the workspace's executables
    apis: list[ApiSpec] = Field(default_factory=list)  # its `apis:`, checked: the api_<name> tools
    warnings: list[Problem] = Field(default_factory=list)

    @property
    def sandboxed(self) -> bool:
        """The step runs in a sandbox worker: its agent says `sandbox: true`, or it may run
        programs (`bash`, `scripts` or a `script_*` tool)."""
        return self.settings.sandbox or runs_programs(self.settings.tools)


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


# --------------------------------------------------------------------------- settings


def _describe(annotation: Any) -> str:
    """What a settings field expects, in words."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(parts)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin is list:
        return "a list of strings" if typing.get_args(annotation) == (str,) else "a list"
    if origin is dict or annotation is dict:
        return "a mapping"
    return {str: "a string", float: "a number", int: "a whole number", bool: "true or false"}.get(annotation, str(annotation))


def _suggest(word: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_S = typing.TypeVar("_S", bound=BaseModel)


def _settings(cls: type[_S], front: Front, rel: str) -> tuple[_S, list[Problem], list[Problem]]:
    """Validate frontmatter against a settings model: (settings, errors, warnings).

    Unknown fields are warnings with the closest known field suggested; a field of the
    wrong type is an error naming the file, line and field. With errors, the settings are
    those of the fields that validated (the others at their defaults): not to run with, but
    so the checks that read settings still find every other problem of the file."""
    known = cls.model_fields
    warnings: list[Problem] = []
    for key in front.data:
        if key not in known:
            warnings.append(
                Problem(
                    file=rel,
                    line=front.lines.get(key),
                    field=key,
                    severity="warning",
                    message=f"unknown setting {key!r}{_suggest(key, known)}; it is ignored",
                )
            )
    judge = front.data.get("judge")
    if cls is WorkspaceSettings and isinstance(judge, dict):
        for key in judge:
            if key not in JUDGE_FIELDS:
                warnings.append(
                    Problem(
                        file=rel,
                        line=front.lines.get("judge"),
                        field=f"judge.{key}",
                        severity="warning",
                        message=f"unknown judge setting {key!r}{_suggest(str(key), JUDGE_FIELDS)}; it is ignored",
                    )
                )
    data = {k: v for k, v in front.data.items() if k in known}
    try:
        return cls.model_validate(data), [], warnings
    except ValidationError as e:
        by_field: dict[str, list[ErrorDetails]] = {}
        for err in e.errors():
            by_field.setdefault(str(err["loc"][0]), []).append(err)
        errors = []
        for field, errs in by_field.items():
            value = data.get(field)
            if any(err["type"].endswith("_type") or err["type"] in ("literal_error",) for err in errs):
                message = f"expected {_describe(known[field].annotation)}, got {type_name(value)}"
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    message += f" ({value!r})"
            else:
                message = errs[0]["msg"]
            errors.append(Problem(file=rel, line=front.lines.get(field), field=field, message=message))
        try:
            partial = cls.model_validate({k: v for k, v in data.items() if k not in by_field})
        except ValidationError:  # pragma: no cover - each field validates on its own
            partial = cls()
        return partial, errors, warnings


def _stub_problems(stub: Any, front: Front, rel: str, field: str) -> list[Problem]:
    """A problem (file, line, field) for each stub answer header whose value the stub
    executor would refuse at run time (`cost: inf`, an unbounded `delay_ms`)."""
    problems = []
    for index, bad in header_problems(stub):
        where = field if index is None else f"{field}[{index}]"
        start = front.text_lines.get(where)  # a block scalar: its lines are the file's
        line = start + bad.line if start is not None else front.lines.get(where, front.lines.get(field.split(".")[0]))
        problems.append(Problem(file=rel, line=line, field=where, message=f"header {bad}"))
    return problems


def _merge_settings(account: WorkspaceSettings | None, own: WorkspaceSettings) -> WorkspaceSettings:
    """The workspace's settings over the account's, field by field (and inside `judge`).

    A field counts as set when the file gives it a value other than null."""
    merged: dict[str, Any] = {}
    for layer in (account, own):
        if layer is None:
            continue
        for key, value in layer.model_dump(exclude_unset=True, exclude_none=True).items():
            if key == "judge" and isinstance(merged.get("judge"), dict):
                value = {**merged["judge"], **{k: v for k, v in value.items() if v is not None}}
            merged[key] = value
    return WorkspaceSettings.model_validate(merged)


# --------------------------------------------------------------------------- files


_SKIP_DIRS = {".git", "__pycache__", "outputs", "storage"}


def _rel(path: Path, root: Path) -> str:
    text, base = str(path), str(root)
    if text.startswith(base + os.sep):  # a file of the workspace: its tail (a step reads a dozen)
        return text[len(base) + 1 :].replace(os.sep, "/")
    return Path(os.path.relpath(path, root)).as_posix()


def _files(folder: Path, pattern: str = "*") -> list[Path]:
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


def _docs(folder: Path, root: Path, pattern: str, warnings: list[Problem]) -> list[Doc]:
    """Text documents of a folder. A file that is not UTF-8 is left out with a warning."""
    docs = []
    for path in _files(folder, pattern):
        rel = _rel(path, root)
        try:
            text = read_text(path, rel)
        except WorkspaceInvalid as e:
            warnings.extend(p.model_copy(update={"severity": "warning", "message": p.message + "; left out"}) for p in e.problems)
            continue
        docs.append(Doc(path=rel, text=text))
    return docs


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _agent_md(root: Path, name: str) -> Path | None:
    if not isinstance(name, str) or not _NAME.match(name):
        return None
    path = root / "agents" / name / "agent.md"
    return path if path.is_file() else None


def has_agent(ws: Workspace, name: str) -> bool:
    """Whether `agents/<name>/agent.md` exists (looked up on disk, now)."""
    return _agent_md(ws.root, name) is not None


# --------------------------------------------------------------------------- loading


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
        rel = _rel(md, path)
        try:
            front = read_front(md, rel)
        except WorkspaceInvalid as e:
            errors.extend(e.problems)
            layers.append(None)
            continue
        errors.extend(front.errors)
        warnings.extend(front.warnings)
        settings, errs, warns = _settings(WorkspaceSettings, front, rel)
        errors.extend(errs)
        warnings.extend(warns)
        if settings is not None and settings.judge:
            errors.extend(_stub_problems(settings.judge.get("stub"), front, rel, "judge.stub"))
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
            if not d.is_dir() or d.name.startswith(".") or d.name in _SKIP_DIRS:
                continue
            if _agent_md(path, d.name):
                agent_names.append(d.name)
            else:
                warnings.append(
                    Problem(
                        file=_rel(d, path),
                        severity="warning",
                        message="folder has no agent.md; it is not an agent",
                    )
                )
    return agent_names


def _flow_names(path: Path, warnings: list[Problem]) -> list[str]:
    """The flows of a workspace: `flows/*.yaml` (a `.yml` file is a warning)."""
    flow_names = [p.stem for p in _files(path / "flows", "*.yaml")]
    for p in _files(path / "flows", "*.yml"):
        warnings.append(
            Problem(
                file=_rel(p, path),
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
        settings=_merge_settings(layers[0], layers[1] or WorkspaceSettings()),
        instructions=instructions,
        knowledge=_docs(path / "knowledge", path, "*.md", warnings),
        memory=_docs(path / "memory", path, "*.md", warnings),
        state=_docs(path / "state", path, "*", warnings),
        agent_names=agent_names,
        flow_names=flow_names,
        warnings=warnings,
    )
    return ws, errors


def load_workspace(root: str | Path, account: str | Path | None = None) -> Workspace:
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


def _read_skills(agent_dir: Path, root: Path, errors: list[Problem], warnings: list[Problem]) -> list[Skill]:
    """Skills in both layouts: `skills/<skill>/SKILL.md` and flat `skills/<name>.md`."""
    skills_dir = agent_dir / "skills"
    if not skills_dir.is_dir():
        return []
    found: list[tuple[str, Path]] = []
    for entry in sorted(skills_dir.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry / "SKILL.md").is_file():
            found.append((entry.name, entry / "SKILL.md"))
        elif entry.is_file() and entry.suffix == ".md":
            found.append((entry.stem, entry))
    skills = []
    for default_name, path in found:
        rel = _rel(path, root)
        try:
            front = read_front(path, rel)
        except WorkspaceInvalid as e:
            errors.extend(e.problems)
            continue
        errors.extend(front.errors)
        warnings.extend(front.warnings)
        name, description = front.data.get("name", default_name), front.data.get("description")
        for field, value in (("name", name), ("description", description)):
            if value is not None and not isinstance(value, str):
                errors.append(
                    Problem(
                        file=rel, line=front.lines.get(field), field=field, message=f"expected a string, got {type_name(value)}"
                    )
                )
        if not isinstance(name, str) or (description is not None and not isinstance(description, str)):
            continue
        if not description:
            warnings.append(
                Problem(
                    file=rel,
                    field="description",
                    severity="warning",
                    message="skill has no description; the agent sees only its name",
                )
            )
        skills.append(Skill(name=name, description=(description or "").strip(), path=rel))
    return skills


def _effort_not_taken(settings: AgentSettings, model: str | None, front: Front, rel: str) -> list[Problem]:
    """A warning when the agent's model (its own, else the workspace's) is known not to take
    its `effort:` level: the step would not send it (and its trace would say so)."""
    price = catalog().price(model) if settings.effort and model and model != "stub" else None
    if price is None or settings.effort in price.efforts:
        return []
    takes = f"takes effort {', '.join(price.efforts)}" if price.efforts else "takes no effort setting"
    return [
        Problem(
            file=rel,
            line=front.lines.get("effort"),
            field="effort",
            severity="warning",
            message=f"model {model} {takes}: effort {settings.effort!r} would not be sent",
        )
    ]


def _ignored_settings(front: Front, rel: str, scripts: list[ScriptTool]) -> list[Problem]:
    """What agent.md asks for that nothing would do, refused rather than silently ignored: a
    tool name that names no tool (with the closest one).
    Read from the frontmatter as written, so they are found beside a setting of the wrong type."""
    problems = []
    tools = front.data.get("tools")
    names = [t for t in tools if isinstance(t, str)] if isinstance(tools, list) else []
    for index, name, close in unknown_tools(names, scripts):
        hint = f" (did you mean {close!r}?)" if close else ""
        if name.startswith(API_PREFIX):  # an API's tool is granted by its apis: entry alone
            hint = f" (an API tool comes from its apis: entry alone; remove {name} from tools:)"
        problems.append(
            Problem(
                file=rel,
                line=front.lines.get(f"tools[{index}]", front.lines.get("tools")),
                field=f"tools[{index}]",
                message=f"unknown tool {name!r}{hint}; the tools are the file tools, bash, scripts, script_<name>, peers and ask",
            )
        )
    return problems


def _program_settings(settings: AgentSettings, front: Front, rel: str, refused: set[str | None]) -> list[Problem]:
    """Settings of the programs an agent runs, checked: `secrets:` names that cannot be
    declared, and `size:` on an agent that runs no program (its limits would bind nothing).
    A check that reads a `refused` setting (of the wrong type, already a problem) is skipped."""
    problems = []
    try:
        declared_secrets(list(settings.secrets))
    except InvalidInput as error:
        problems.append(
            Problem(file=rel, line=front.lines.get("secrets"), field="secrets", message=str(error).removeprefix("secrets: "))
        )
    if "tools" in refused:
        return problems
    if "ask_timeout" in front.data and "ask_timeout" not in refused and ASK not in settings.tools:
        problems.append(
            Problem(
                file=rel,
                line=front.lines.get("ask_timeout"),
                field="ask_timeout",
                message="ask_timeout bounds the ask tool's wait; this agent has no ask tool (tools: [ask]), so it would be ignored",
            )
        )
    if settings.size and not runs_programs(settings.tools):
        problems.append(
            Problem(
                file=rel,
                line=front.lines.get("size"),
                field="size",
                message="size sets the limits of the programs an agent runs (bash, script tools); this agent runs none, so it would be ignored",
            )
        )
    return problems


def load_agent(ws: Workspace, name: str) -> Agent:
    """Read `agents/<name>/`: settings and persona from agent.md, skills, memory,
    knowledge and scripts. Parses afresh on every call.

    Raises `WorkspaceInvalid` for an unknown agent, or listing every problem of its
    agent.md and skill files when any of them cannot be read or has a setting of the
    wrong type."""
    md = _agent_md(ws.root, name)
    if md is None:
        raise WorkspaceInvalid(f"no agent {name!r} (agents/{name}/agent.md not found)")
    root = ws.root
    agent_dir = md.parent
    rel = _rel(md, root)
    errors: list[Problem] = []
    warnings: list[Problem] = []
    settings: AgentSettings | None = None
    persona = ""
    apis: list[ApiSpec] = []
    script_tools = discover_scripts(root, _rel(agent_dir, root))
    try:
        front = read_front(md, rel)
    except WorkspaceInvalid as e:
        errors.extend(e.problems)
    else:
        persona = front.body
        errors.extend(front.errors)
        warnings.extend(front.warnings)
        settings, errs, warns = _settings(AgentSettings, front, rel)
        errors.extend(errs)
        warnings.extend(warns)
        refused = {p.field for p in errs}
        errors.extend(_ignored_settings(front, rel, script_tools))
        written = front.data.get("apis")  # not a list: the settings' own check says so
        apis, api_problems = check_apis(
            written if isinstance(written, list) else None,
            rel=rel,
            agent_dir=agent_dir,
            lines=front.lines,
            secrets=front.data.get("secrets"),
        )
        errors.extend(api_problems)
        # On the settings that validated, also beside one that did not: every problem of
        # the file is listed at once. A check that reads a refused setting is left out (it
        # would judge the default standing in for it).
        errors.extend(_stub_problems(settings.stub, front, rel, "stub"))
        if not refused & {"effort", "model"}:
            warnings.extend(_effort_not_taken(settings, settings.model or ws.settings.model, front, rel))
        errors.extend(_program_settings(settings, front, rel, refused))
    skills = _read_skills(agent_dir, root, errors, warnings)
    if errors or settings is None:
        raise WorkspaceInvalid(f"agent {name!r} cannot be read", errors)
    scripts_dir = agent_dir / "scripts"
    scripts = [_rel(p, root) for p in _files(scripts_dir) if "__pycache__" not in p.parts]
    return Agent(
        name=name,
        path=_rel(agent_dir, root),
        settings=settings,
        persona=persona,
        skills=skills,
        memory=_docs(agent_dir / "memory", root, "*.md", warnings),
        knowledge=_docs(agent_dir / "knowledge", root, "*.md", warnings),
        scripts=scripts,
        script_tools=script_tools,
        apis=apis,
        warnings=warnings,
    )


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
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS]
        for n in names:
            if not n.startswith("."):
                full = Path(folder) / n
                files.append((_rel(full, path), full))
    digest = hashlib.sha256()
    for rel, full in sorted(files):
        data = full.read_bytes()
        # Length-prefixed, so no two different workspaces hash the same byte stream.
        name = rel.encode("utf-8")
        digest.update(len(name).to_bytes(8, "big") + name)
        digest.update(len(data).to_bytes(8, "big") + data)
    return "sha256:" + digest.hexdigest()
