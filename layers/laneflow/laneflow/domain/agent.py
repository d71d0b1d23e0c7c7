"""Reading an agent: `agents/<name>/` (README, "A workspace"), its agent.md's settings and
persona, its skills, memory, knowledge, scripts and APIs, every problem of its files listed
at once (`load_agent`)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from laneflow.domain.apis import API_PREFIX, ApiSpec, check_apis
from laneflow.domain.delegation import DELEGATE
from laneflow.domain.errors import InvalidInput, Problem, WorkspaceInvalid
from laneflow.domain.frontmatter import Front, read_front, type_name
from laneflow.domain.inbox import ASK
from laneflow.domain.mcp import MCP_PREFIX, McpServer, check_mcp, merged
from laneflow.domain.network import network_problems, parse_network
from laneflow.domain.pricing import catalog
from laneflow.domain.secrets import declared_secrets
from laneflow.domain.tools import ScriptTool, discover_scripts, runs_programs, unknown_tools, web_tools
from laneflow.domain.workspace_files import Doc, Readings, agent_md, folder_marks, read_docs, rel_path, visible_files
from laneflow.domain.workspace_settings import AgentSettings, read_settings, stub_problems

if TYPE_CHECKING:
    from laneflow.domain.workspace import Workspace


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
    mcp: list[McpServer] = Field(default_factory=list)  # AGENTS.md's and its own `mcp:`, checked: mcp__<name>__* tools
    network: list[str] = Field(default_factory=list)  # its `network:`, checked: the destinations its programs reach
    warnings: list[Problem] = Field(default_factory=list)

    @property
    def sandboxed(self) -> bool:
        """The step runs in a sandbox worker: its agent says `sandbox: true`, or it may run
        programs (`bash`, `scripts` or a `script_*` tool)."""
        return self.settings.sandbox or runs_programs(self.settings.tools)


def has_agent(ws: Workspace, name: str) -> bool:
    """Whether `agents/<name>/agent.md` exists (looked up on disk, now)."""
    return agent_md(ws.root, name) is not None


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
        rel = rel_path(path, root)
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
        if name == DELEGATE:
            hint = " (the delegate tool comes from delegates: alone; remove delegate from tools:)"
        if name.startswith(MCP_PREFIX):  # a server's tools are granted by its mcp: entry alone
            hint = f" (an MCP server's tools come from its mcp: entry alone; remove {name} from tools:)"
        problems.append(
            Problem(
                file=rel,
                line=front.lines.get(f"tools[{index}]", front.lines.get("tools")),
                field=f"tools[{index}]",
                message=f"unknown tool {name!r}{hint}; the tools are the file tools, bash, scripts, script_<name>, peers, ask, search, history, web_search and web_fetch",
            )
        )
    return problems


def _delegate_problems(ws: Workspace, name: str, front: Front, rel: str) -> list[Problem]:
    """`delegates:` entries that name no agent (with the closest one), the agent itself or a
    name given twice."""
    written = front.data.get("delegates")
    problems: list[Problem] = []
    if not isinstance(written, list):
        return problems  # absent, or of the wrong type (the settings' own check says so)
    agents_dir = ws.root / "agents"
    known = sorted(p.name for p in agents_dir.iterdir() if (p / "agent.md").is_file()) if agents_dir.is_dir() else []
    seen: set[str] = set()
    for index, target in enumerate(written):
        if not isinstance(target, str):
            continue
        why = None
        if target == name:
            why = f"{name} cannot delegate to itself"
        elif target in seen:
            why = f"{target!r} is named twice"
        elif not has_agent(ws, target):
            close = difflib.get_close_matches(target, known, n=1, cutoff=0.5)
            why = f"no agent {target!r} (agents/{target}/agent.md not found)" + (f"; did you mean {close[0]!r}?" if close else "")
        seen.add(target)
        if why:
            line = front.lines.get(f"delegates[{index}]", front.lines.get("delegates"))
            problems.append(Problem(file=rel, line=line, field=f"delegates[{index}]", message=why))
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
    if "web_max_uses" in front.data and "web_max_uses" not in refused and not web_tools(settings.tools):
        problems.append(
            Problem(
                file=rel,
                line=front.lines.get("web_max_uses"),
                field="web_max_uses",
                message="web_max_uses bounds the web tools' uses; this agent has no web tool (tools: [web_search, web_fetch]), so it would be ignored",
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


def _mcp_servers(ws: Workspace, front: Front, rel: str, name: str) -> tuple[list[McpServer], list[Problem]]:
    """The agent's MCP servers: AGENTS.md's (checked with AGENTS.md, their secrets here) and
    its own `mcp:`, an own entry replacing the workspace's of the same name."""
    secrets = front.data.get("secrets") or []  # none declared: every ${NAME} is refused
    written = front.data.get("mcp")  # not a list: the settings' own check says so
    own, problems = check_mcp(written if isinstance(written, list) else None, rel=rel, lines=front.lines, secrets=secrets)
    shared, _ = check_mcp(ws.settings.mcp or None, rel="AGENTS.md", lines={}, secrets=None)
    declared = [s for s in secrets if isinstance(s, str)] if isinstance(secrets, list) else []
    servers, more = merged(shared, own, secrets=declared, rel="AGENTS.md", agent=name)
    return servers, problems + more


_agents: Readings[Agent] = Readings(64)


def _agent_signature(ws: Workspace, name: str, reading: tuple[object, ...]) -> tuple[object, ...]:
    """What reading an agent depends on: its workspace's reading, every file and folder of
    its own folder, and the workspace's scripts."""
    root = str(ws.root)
    return (reading, folder_marks(f"{root}/agents/{name}", below=True), folder_marks(f"{root}/scripts"))


def load_agent(ws: Workspace, name: str) -> Agent:
    """`read_agent`, reusing the last reading of the agent while nothing it read changed (its
    folder, the workspace's scripts, and the workspace's own reading, `load_workspace`'s: a
    workspace read otherwise has its agents read afresh). Each caller gets a model of its own."""
    reading = getattr(ws, "_reading", None)
    if reading is None or agent_md(ws.root, name) is None:
        return read_agent(ws, name)
    return _agents.read(
        (str(ws.root), name), lambda: _agent_signature(ws, name, reading), lambda _signature: read_agent(ws, name)
    )


def read_agent(ws: Workspace, name: str) -> Agent:
    """Read `agents/<name>/`: settings and persona from agent.md, skills, memory,
    knowledge and scripts. Parses afresh on every call.

    Raises `WorkspaceInvalid` for an unknown agent, or listing every problem of its
    agent.md and skill files when any of them cannot be read or has a setting of the
    wrong type."""
    md = agent_md(ws.root, name)
    if md is None:
        raise WorkspaceInvalid(f"no agent {name!r} (agents/{name}/agent.md not found)")
    root = ws.root
    agent_dir = md.parent
    rel = rel_path(md, root)
    errors: list[Problem] = []
    warnings: list[Problem] = []
    settings: AgentSettings | None = None
    persona = ""
    apis: list[ApiSpec] = []
    mcp: list[McpServer] = []
    script_tools = discover_scripts(root, rel_path(agent_dir, root))
    try:
        front = read_front(md, rel)
    except WorkspaceInvalid as e:
        errors.extend(e.problems)
    else:
        persona = front.body
        errors.extend(front.errors)
        warnings.extend(front.warnings)
        settings, errs, warns = read_settings(AgentSettings, front, rel)
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
        mcp, mcp_problems = _mcp_servers(ws, front, rel, name)
        errors.extend(mcp_problems)
        # On the settings that validated, also beside one that did not: every problem of
        # the file is listed at once. A check that reads a refused setting is left out (it
        # would judge the default standing in for it).
        errors.extend(stub_problems(settings.stub, front, rel, "stub"))
        if not refused & {"effort", "model"}:
            warnings.extend(_effort_not_taken(settings, settings.model or ws.settings.model, front, rel))
        errors.extend(_program_settings(settings, front, rel, refused))
        errors.extend(_delegate_problems(ws, name, front, rel))
        if "network" not in refused:  # of the wrong type: already a problem
            sandboxed = settings.sandbox or runs_programs(settings.tools) or bool(refused & {"tools", "sandbox"})
            errors.extend(network_problems(front.data.get("network"), sandboxed=sandboxed, rel=rel, lines=front.lines))
    skills = _read_skills(agent_dir, root, errors, warnings)
    if errors or settings is None:
        raise WorkspaceInvalid(f"agent {name!r} cannot be read", errors)
    scripts_dir = agent_dir / "scripts"
    scripts = [rel_path(p, root) for p in visible_files(scripts_dir) if "__pycache__" not in p.parts]
    return Agent(
        name=name,
        path=rel_path(agent_dir, root),
        settings=settings,
        persona=persona,
        skills=skills,
        memory=read_docs(agent_dir / "memory", root, "*.md", warnings),
        knowledge=read_docs(agent_dir / "knowledge", root, "*.md", warnings),
        scripts=scripts,
        script_tools=script_tools,
        apis=apis,
        mcp=mcp,
        network=[d.text() for d in parse_network(settings.network)[0]],
        warnings=warnings,
    )
