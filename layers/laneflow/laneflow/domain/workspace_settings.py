"""The settings of a workspace's files: `agent.md`'s frontmatter (`AgentSettings`) and
`AGENTS.md`'s (`WorkspaceSettings`), validated into problems that name the file, line and
field, and the workspace's settings merged over the account's."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from laneflow.domain.errors import Problem
from laneflow.domain.frontmatter import Front, type_name
from laneflow.domain.inbox import ASK_TIMEOUT_BOUNDS, DEFAULT_ASK_TIMEOUT_S
from laneflow.domain.stub_answers import header_problems
from laneflow.domain.tools import DEFAULT_WEB_MAX_USES

CacheTtlSetting = Literal["5m", "1h", "auto"]


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
    web_max_uses: int = Field(default=DEFAULT_WEB_MAX_USES, ge=1, description="uses of each web tool a model turn")
    sandbox: bool = False
    size: Literal["small", "medium", "large"] | None = None
    secrets: list[str] = Field(default_factory=list)
    apis: list[Any] = Field(default_factory=list)  # checked into `Agent.apis` (domain/apis.py)
    delegates: list[str] = Field(default_factory=list)  # the agents its `delegate` tool may call (domain/delegation.py)
    mcp: list[Any] = Field(default_factory=list)  # checked into `Agent.mcp` (domain/mcp.py)
    network: str | list[Any] | None = None  # `none` or destinations, checked into `Agent.network` (domain/network.py)
    stub: str | list[str] | None = None
    description: str | None = None
    # The prompt cache's TTL for its writes (domain/cache_ttl.py); unset: AGENTS.md's.
    cache_ttl: CacheTtlSetting | None = None


class WorkspaceSettings(BaseModel):
    """The frontmatter of `AGENTS.md`: the workspace's, else the account's, field by field."""

    model_config = ConfigDict(strict=True, extra="ignore", protected_namespaces=())

    model: str | None = None
    capture: Literal["full", "metadata"] = "full"
    judge: dict[str, Any] | None = None  # {model, effort} for `verify: judge`
    network_enforce: bool | None = None
    budget: float | None = Field(default=None, gt=0)
    locale: str | None = None
    mcp: list[Any] = Field(default_factory=list)  # every agent's MCP servers (domain/mcp.py)
    cache_ttl: CacheTtlSetting = "auto"  # every agent's, unless its agent.md sets one


JUDGE_FIELDS = ("model", "effort", "stub")  # stub: the judge's answers on the stub model


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


def read_settings(cls: type[_S], front: Front, rel: str) -> tuple[_S, list[Problem], list[Problem]]:
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


def stub_problems(stub: Any, front: Front, rel: str, field: str) -> list[Problem]:
    """A problem (file, line, field) for each stub answer header whose value the stub
    executor would refuse at run time (`cost: inf`, an unbounded `delay_ms`)."""
    problems = []
    for index, bad in header_problems(stub):
        where = field if index is None else f"{field}[{index}]"
        start = front.text_lines.get(where)  # a block scalar: its lines are the file's
        line = start + bad.line if start is not None else front.lines.get(where, front.lines.get(field.split(".")[0]))
        problems.append(Problem(file=rel, line=line, field=where, message=f"header {bad}"))
    return problems


def merge_settings(account: WorkspaceSettings | None, own: WorkspaceSettings) -> WorkspaceSettings:
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
