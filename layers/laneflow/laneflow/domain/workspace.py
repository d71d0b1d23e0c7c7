"""Reading a workspace from disk (README, "A workspace").

A workspace is a folder: `AGENTS.md` (settings in its frontmatter, shared instructions in
its body), `agents/<name>/` folders, `flows/*.yaml`, and shared `knowledge/`, `memory/`
and `state/`. A tenant may also have an account-level `AGENTS.md` whose settings fill the
gaps the workspace leaves, field by field.

Everything here reads afresh on every call: there is no cache, so the same bytes always
give the same result, and an edited file is seen at once.

Problems are `errors.Problem`s with paths relative to the workspace (the account's
`AGENTS.md` shows as a relative path such as `../AGENTS.md`). A file that cannot be read
raises `WorkspaceInvalid` listing every problem found; warnings (a value read leniently,
an unknown setting) ride along on the returned models.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import frontmatter
import yaml
from frontmatter.default_handlers import YAMLHandler
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from laneflow.domain import jsonsafe
from laneflow.domain.errors import Problem, WorkspaceInvalid
from laneflow.domain.stub_answers import header_problems

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
    effort: str | None = None
    tools: list[str] = Field(default_factory=list)
    budget: float | None = Field(default=None, gt=0, description="USD cap for one step")
    timeout: float | None = Field(default=None, gt=0, description="seconds")
    max_turns: int | None = Field(default=None, ge=1)
    sandbox: bool = False
    size: str | None = None
    secrets: list[str] = Field(default_factory=list)
    apis: list[str] = Field(default_factory=list)
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
    warnings: list[Problem] = Field(default_factory=list)



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



# --------------------------------------------------------------------------- frontmatter


class _Front(typing.NamedTuple):
    data: dict[str, Any]
    body: str
    warnings: list[Problem]
    lines: dict[str, int]  # top-level key -> line in the file (a list's items as `key[i]`)
    text_lines: dict[str, int] = {}  # a block scalar's field -> the line its text starts on



class UnfitValue(yaml.MarkedYAMLError):
    """YAML that parses but holds a value laneflow does not take (see `StrictLoader`)."""



class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing with the value's line what would crash or poison later:

    - nesting deeper than `jsonsafe.MAX_DEPTH` (the composer recurses: 3,000 levels exhaust
      the stack);
    - integers of more than `jsonsafe.MAX_DIGITS` digits (past 4,300 Python refuses them
      with a ValueError, not a YAML error);
    - `.inf` and `.nan` (no setting or JSON value can hold them);
    - text holding a lone surrogate (`"\\ud800"`), which is not a character and cannot be
      stored.

    Workspace frontmatter and flows are read with it."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > jsonsafe.MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise UnfitValue(None, None, f"nested deeper than {jsonsafe.MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = len(str(node.value).replace("_", "").lstrip("+-"))
        if digits > jsonsafe.MAX_DIGITS:
            raise UnfitValue(None, None, f"a number of {digits} digits; at most {jsonsafe.MAX_DIGITS} are taken", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            shown = node.value if len(node.value) <= 30 else node.value[:30] + "…"
            raise UnfitValue(None, None, f"{shown!r} is not a finite number", node.start_mark)
        return value

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value = super().construct_yaml_str(node)
        found = jsonsafe.refusal(value)
        if found is not None:
            raise UnfitValue(None, None, found.reason, node.start_mark)
        return value



StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)

StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)

StrictLoader.add_constructor("tag:yaml.org,2002:str", StrictLoader.construct_yaml_str)



class _CapturingYAML(YAMLHandler):
    """python-frontmatter's YAML handler, keeping what it parsed.

    `frontmatter.loads` drops frontmatter that is not a mapping without a word; keeping the
    raw value lets us report it. `rewrite` is the lenient pass. One instance per read."""

    def __init__(self, rewrite: typing.Callable[[str], str] | None = None):
        self.rewrite = rewrite
        self.raw: Any = None
        self.fm = ""

    def load(self, fm: str, **kwargs: object) -> Any:
        if self.rewrite is not None:
            fm = self.rewrite(fm)
        self.fm = fm
        self.raw = super().load(fm, **{**kwargs, "Loader": StrictLoader})
        # python-frontmatter passes a mapping on as keyword arguments, which a key that is
        # not text (`5: x`) breaks: the caller reads `raw` (and reports such keys) instead.
        return {}



# A `key: value` line (optionally a `- key: value` list item) whose value is a plain scalar.
_KEY_VALUE = re.compile(
    r"^(?P<lead>[ \t]*(?:-[ \t]+)?)(?P<key>[A-Za-z0-9_][^:#]*?|\"[^\"]*\"|'[^']*'):[ \t]+(?P<value>\S.*?)[ \t]*$"
)

_NOT_PLAIN = tuple("\"'[{|>&*!%@`")

_BLOCK_SCALAR = re.compile(r"^[|>][-+0-9]*$")



def _quote_colon_values(fm: str) -> tuple[str, list[tuple[int, str]]]:
    """Quote plain values that contain `: ` (or end with `:`), which YAML reads as a nested
    mapping and refuses (`description: Use when: the user asks`).

    Returns the new text (the same number of lines) and the (line index, key) of each value
    quoted. Lines inside block scalars (`key: |`) are left alone."""
    out: list[str] = []
    quoted: list[tuple[int, str]] = []
    block_indent: int | None = None  # indent of the key that opened a block scalar
    for i, line in enumerate(fm.split("\n")):
        indent = len(line) - len(line.lstrip(" \t"))
        if block_indent is not None:
            if not line.strip() or indent > block_indent:
                out.append(line)
                continue
            block_indent = None
        m = _KEY_VALUE.match(line)
        if not m:
            out.append(line)
            continue
        value = m.group("value")
        if _BLOCK_SCALAR.match(value.split(" #")[0].strip()):
            block_indent = indent
            out.append(line)
            continue
        if value.startswith(_NOT_PLAIN) or value.startswith("#"):
            out.append(line)
            continue
        # In a plain scalar, " #" starts a comment: keep the comment outside the quotes.
        comment = ""
        if " #" in value:
            value, rest = value.split(" #", 1)
            value, comment = value.rstrip(), " #" + rest
        if ": " not in value and not value.endswith(":"):
            out.append(line)
            continue
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'{m.group("lead")}{m.group("key")}: "{escaped}"{comment}')
        quoted.append((i, m.group("key").strip("\"'")))
    return "\n".join(out), quoted



def _read_text(path: Path, rel: str) -> str:
    """A file's text as UTF-8; `WorkspaceInvalid` naming the file when it is not."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkspaceInvalid(
            f"cannot read {rel}", [Problem(file=rel, message=f"cannot read: {e.strerror or e}")]
        ) from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkspaceInvalid(
            f"{rel} is not UTF-8 text",
            [Problem(file=rel, line=line, message=f"not UTF-8 text (byte {e.start})")],
        ) from None



def yaml_error_at(e: yaml.YAMLError, text: str) -> tuple[int | None, str]:
    """Where (0-based line of `text`, when known) and what a YAML error says, in one line.
    A character YAML does not take (a control character) is a ReaderError with a position."""
    if isinstance(e, yaml.reader.ReaderError):
        return text[: e.position].count("\n"), f"unacceptable character #x{e.character:04x}: {e.reason}"
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return (mark.line if mark is not None else None), getattr(e, "problem", None) or str(e)



def _yaml_problem(e: yaml.YAMLError, rel: str, first_line: int, fm: str = "") -> Problem:
    """A YAML error as a Problem; `first_line` is the file line of the text's line 0."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    at, what = yaml_error_at(e, fm)
    line = first_line + at if at is not None else None
    context = getattr(e, "context", None)
    context_mark = getattr(e, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        context += f" started on line {first_line + context_mark.line}"
    if isinstance(e, UnfitValue):
        return Problem(file=rel, line=line, message=f"frontmatter: {what}")
    message = f"frontmatter does not parse: {what}" + (f" ({context})" if context else "")
    return Problem(file=rel, line=line, message=message)



class _Lines(typing.NamedTuple):
    keys: dict[str, int]  # top-level key -> its line; a list's items as `key[i]`
    text: dict[str, int]  # a block scalar (`key: |`) by field -> the line its text starts on
    bad_keys: list[Problem]  # keys that are not text (`5: x`, `~: x`); `file` left empty



def _key_lines(fm: str, first_line: int) -> _Lines:
    """Where things are in frontmatter that has parsed: the file line of each top-level key
    and list item, where each block scalar's text starts, and a problem for each key that
    is not text."""
    lines = _Lines({}, {}, [])
    try:
        node = yaml.compose(fm, Loader=StrictLoader)
    except yaml.YAMLError:  # pragma: no cover - the text has just parsed
        return lines
    if not isinstance(node, yaml.MappingNode):
        return lines
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        key = str(k.value)
        lines.keys[key] = first_line + k.start_mark.line
        if k.tag != "tag:yaml.org,2002:str":
            tag = k.tag.rsplit(":", 1)[-1]
            what = {"int": "a number", "float": "a number", "bool": "true/false", "null": "null"}.get(tag, tag)
            lines.bad_keys.append(
                Problem(file="", line=lines.keys[key], field=key[:40],
                        message=f"a setting's name must be text, not {what} ({key[:40]}); quote it or remove it")
            )
        fields = [(key, v)] + ([(f"{key}[{i}]", item) for i, item in enumerate(v.value)] if isinstance(v, yaml.SequenceNode) else [])
        for field, value in fields:
            if field != key:
                lines.keys[field] = first_line + value.start_mark.line
            if isinstance(value, yaml.ScalarNode) and value.style in ("|", ">"):
                lines.text[field] = first_line + value.start_mark.line + 1
    return lines



def _read_front(path: Path, rel: str) -> _Front:
    text = _read_text(path, rel)
    stripped = text.strip()  # as python-frontmatter does before splitting
    lead = text[: len(text) - len(text.lstrip())].count("\n")
    opening = YAMLHandler.FM_BOUNDARY.match(stripped)
    if not opening:
        return _Front({}, stripped, [], {})
    # The file line of the frontmatter text's first line: the rest of the opening `---` line.
    first_line = lead + stripped.count("\n", 0, opening.end()) + 1
    if len(YAMLHandler.FM_BOUNDARY.split(stripped, 2)) < 3:
        raise WorkspaceInvalid(
            f"{rel} does not parse",
            [Problem(file=rel, line=lead + 1, message="frontmatter opened with '---' is never closed")],
        )

    handler = _CapturingYAML()
    warnings: list[Problem] = []
    try:
        post = frontmatter.loads(text, handler=handler)
    except yaml.YAMLError as strict_error:
        quoted: list[tuple[int, str]] = []

        def lenient(fm: str) -> str:
            new, found = _quote_colon_values(fm)
            quoted.extend(found)
            return new

        handler = _CapturingYAML(lenient)
        try:
            post = frontmatter.loads(text, handler=handler)
        except yaml.YAMLError as e:
            error = e if quoted else strict_error
            raise WorkspaceInvalid(f"{rel} does not parse", [_yaml_problem(error, rel, first_line, handler.fm)]) from None
        if not quoted:  # pragma: no cover - the lenient pass changed nothing, so it fails too
            raise WorkspaceInvalid(f"{rel} does not parse", [_yaml_problem(strict_error, rel, first_line, handler.fm)])
        warnings = [
            Problem(
                file=rel,
                line=first_line + i,
                field=key,
                severity="warning",
                message="value read leniently: it contains ': ', so it was read as one quoted "
                "string; quote it in the file to make that explicit",
            )
            for i, key in quoted
        ]

    raw = handler.raw
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WorkspaceInvalid(
            f"{rel} does not parse",
            [
                Problem(
                    file=rel,
                    line=first_line,
                    message=f"frontmatter must be a mapping of settings (key: value), not {_type_name(raw)}",
                )
            ],
        )
    lines = _key_lines(handler.fm, first_line)
    if lines.bad_keys:
        raise WorkspaceInvalid(f"{rel} does not parse", [p.model_copy(update={"file": rel}) for p in lines.bad_keys])
    data = {str(k): v for k, v in raw.items()}
    return _Front(data, post.content, warnings, lines.keys, lines.text)



def read_frontmatter(path: Path, rel: str) -> tuple[dict, str, list[Problem]]:
    """Read a Markdown file's YAML frontmatter and body.

    Strict first; YAML that fails because a plain value contains `: ` is read again with
    such values quoted, and each one comes back as a warning. `rel` is the path shown in
    problems (relative to the workspace).

    Returns (settings mapping, body, warnings). Raises `WorkspaceInvalid` naming the file
    and line when the file is not UTF-8, the frontmatter does not parse even leniently, or
    it is not a mapping. A file without frontmatter is all body."""
    front = _read_front(Path(path), rel)
    return front.data, front.body, front.warnings



# --------------------------------------------------------------------------- settings


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "true/false",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)



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
    return {str: "a string", float: "a number", int: "a whole number", bool: "true or false"}.get(
        annotation, str(annotation)
    )



def _suggest(word: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""



_S = typing.TypeVar("_S", bound=BaseModel)



def _settings(
    cls: type[_S], front: _Front, rel: str
) -> tuple[_S | None, list[Problem], list[Problem]]:
    """Validate frontmatter against a settings model: (settings or None, errors, warnings).

    Unknown fields are warnings with the closest known field suggested; a field of the
    wrong type is an error naming the file, line and field."""
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
        by_field: dict[str, list[dict]] = {}
        for err in e.errors():
            by_field.setdefault(str(err["loc"][0]), []).append(err)
        errors = []
        for field, errs in by_field.items():
            value = data.get(field)
            if any(err["type"].endswith("_type") or err["type"] in ("literal_error",) for err in errs):
                message = f"expected {_describe(known[field].annotation)}, got {_type_name(value)}"
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    message += f" ({value!r})"
            else:
                message = errs[0]["msg"]
            errors.append(Problem(file=rel, line=front.lines.get(field), field=field, message=message))
        return None, errors, warnings



def _stub_problems(stub: Any, front: _Front, rel: str, field: str) -> list[Problem]:
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
    return Path(os.path.relpath(path, root)).as_posix()



def _files(folder: Path, pattern: str = "*") -> list[Path]:
    """The visible files directly in a folder matching a glob, sorted by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith("."))



def _docs(folder: Path, root: Path, pattern: str, warnings: list[Problem]) -> list[Doc]:
    """Text documents of a folder. A file that is not UTF-8 is left out with a warning."""
    docs = []
    for path in _files(folder, pattern):
        rel = _rel(path, root)
        try:
            text = _read_text(path, rel)
        except WorkspaceInvalid as e:
            warnings.extend(
                p.model_copy(update={"severity": "warning", "message": p.message + "; left out"})
                for p in e.problems
            )
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



def _read_workspace(
    root: str | Path, account: str | Path | None
) -> tuple[Workspace, list[Problem]]:
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
    instructions: list[Doc] = []
    layers: list[WorkspaceSettings | None] = []
    account_md = _account_file(path, account)
    for md in (account_md, path / "AGENTS.md"):
        if md is None or not md.is_file():
            layers.append(None)
            continue
        rel = _rel(md, path)
        try:
            front = _read_front(md, rel)
        except WorkspaceInvalid as e:
            errors.extend(e.problems)
            layers.append(None)
            continue
        warnings.extend(front.warnings)
        settings, errs, warns = _settings(WorkspaceSettings, front, rel)
        errors.extend(errs)
        warnings.extend(warns)
        if settings is not None and settings.judge:
            errors.extend(_stub_problems(settings.judge.get("stub"), front, rel, "judge.stub"))
        layers.append(settings)
        if front.body.strip():
            instructions.append(Doc(path=rel, text=front.body))

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
    flow_names = [p.stem for p in _files(path / "flows", "*.yaml")]
    for p in _files(path / "flows", "*.yml"):
        warnings.append(
            Problem(
                file=_rel(p, path),
                severity="warning",
                message=f"flows end in .yaml; rename it to {p.stem}.yaml to use it",
            )
        )

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
            front = _read_front(path, rel)
        except WorkspaceInvalid as e:
            errors.extend(e.problems)
            continue
        warnings.extend(front.warnings)
        name, description = front.data.get("name", default_name), front.data.get("description")
        for field, value in (("name", name), ("description", description)):
            if value is not None and not isinstance(value, str):
                errors.append(
                    Problem(file=rel, line=front.lines.get(field), field=field,
                            message=f"expected a string, got {_type_name(value)}")
                )
        if not isinstance(name, str) or (description is not None and not isinstance(description, str)):
            continue
        if not description:
            warnings.append(
                Problem(file=rel, field="description", severity="warning",
                        message="skill has no description; the agent sees only its name")
            )
        skills.append(Skill(name=name, description=(description or "").strip(), path=rel))
    return skills



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
    try:
        front = _read_front(md, rel)
    except WorkspaceInvalid as e:
        errors.extend(e.problems)
    else:
        persona = front.body
        warnings.extend(front.warnings)
        settings, errs, warns = _settings(AgentSettings, front, rel)
        errors.extend(errs)
        warnings.extend(warns)
        if settings is not None:
            errors.extend(_stub_problems(settings.stub, front, rel, "stub"))
    skills = _read_skills(agent_dir, root, errors, warnings)
    if errors or settings is None:
        raise WorkspaceInvalid(f"agent {name!r} cannot be read", errors)
    scripts_dir = agent_dir / "scripts"
    scripts = [
        _rel(p, root)
        for p in _files(scripts_dir)
        if "__pycache__" not in p.parts
    ]
    return Agent(
        name=name,
        path=_rel(agent_dir, root),
        settings=settings,
        persona=persona,
        skills=skills,
        memory=_docs(agent_dir / "memory", root, "*.md", warnings),
        knowledge=_docs(agent_dir / "knowledge", root, "*.md", warnings),
        scripts=scripts,
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
