"""Flows: `flows/<name>.yaml`, parsed and validated in full before a run starts (README,
"A flow" and "Flow control").

The models say what each field takes: its type and bounds (`Field(ge=...)`, `Literal`),
its validators, and in words what it is (`Says`), which is what a refused value is told.
Read from a file (`load_flow`, the checker in `flow_check`), a flow is validated with the
`AsWritten` context, so agent names are looked up in the workspace and fan-outs and
schemas are checked as the run will keep them; every problem carries its file, line and
field, and every problem is collected before `FlowInvalid` is raised with all of them: a
person fixes a flow in one go, not one error per try. A flow the store kept is validated
without it (types and bounds only). `validate_input` checks a run's input against the
flow's `input:` schema; `check_workspace` is `laneflow check`: every problem of every
file, collected, never raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from jsonschema import validators
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from laneflow.domain import jsonsafe
from laneflow.domain.errors import (
    FlowInvalid,
    Problem,
    RunInputInvalid,
    WorkspaceInvalid,
)
from laneflow.domain.records import (
    Run,
    Step,
)
from laneflow.domain.workspace import (
    Workspace,
    _read_workspace,
    has_agent,
    load_agent,
)

__all__ = [
    "StepSpec",
    "Entry",
    "Flow",
    "Says",
    "AsWritten",
    "load_flow",
    "validate_input",
    "check_workspace",
    "TOP_KEYS",
    "STEP_KEYS",
    "MAX_CYCLES_LIMIT",
    "DEFAULT_MAX_CYCLES",
]


TOP_KEYS = ("description", "budget", "input", "steps", "then")

THEN_KEYS = ("flow", "input")

STEP_KEYS = (
    "agent",
    "instruction",
    "each",
    "parallel",
    "on_fail",
    "until",
    "loop",
    "max_cycles",
    "output",
    "schema",
    "verify",
    "optional",
    "retries",
    "handoff",
    "model",
)

VERIFY_KEYS = ("judge",)

HANDOFFS = ("results", "conclusions", "data", "none")

OUTPUTS = ("text", "json")

DEFAULT_MAX_CYCLES = 3

MAX_CYCLES_LIMIT = 20  # an evaluator loop past this is a runaway, not a plan

DEFAULT_RETRIES = 1


_EACH_INPUT = re.compile(r"^input\.([A-Za-z_][A-Za-z0-9_-]*)$")

_FLOW_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

PROBLEM = "flow_problem"  # the error type of a refusal that words itself (see `_problem`)


# --------------------------------------------------------------------------- reading


class Says(NamedTuple):
    """What a field of a flow file takes, in words. A value the field refuses is reported
    as "<text>, got <the value>"; `missing` is the problem when a required field is not
    written; `null_ok` lets a written `null` stand for the default."""

    text: str
    missing: str = ""
    null_ok: bool = False


@dataclass(frozen=True)
class AsWritten:
    """The validation context of a flow read from its file: the workspace its agent names
    are looked up in, and the flow's input schema (what `each: input.NAME` must name)."""

    ws: Workspace
    input_schema: dict[str, Any] | None = None


def _as_written(info: ValidationInfo) -> AsWritten | None:
    context = info.context
    return context.get("written") if isinstance(context, dict) else None


def _problem(message: str, at: str = "") -> PydanticCustomError:
    """A refusal in its own words (the checker reports `message` as it is), `at` the path
    below the field (`[2].x`) when the problem is inside its value."""
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": message, "at": at})


def _keepable(value: Any) -> Any:
    """A value the run keeps as JSON (fan-out items, a schema) must be keepable: no key
    that is not text, no date, no alias loop, within the depth and size bounds."""
    found = jsonsafe.refusal(value)
    if found is not None:
        raise _problem(found.reason, found.path[1:] if found.parts else "")
    return value


def _valid_schema(value: dict[str, Any], where: Any) -> dict[str, Any]:
    """`value` must be a JSON Schema; `where(path)` words the path of what is wrong in it."""
    _keepable(value)
    bad = _schema_problem(value)
    if bad is not None:
        raise _problem(f"not a valid JSON Schema: {bad.message}", where(bad.path))
    return value


def _check_each_input(schema: dict[str, Any] | None, name: str) -> None:
    """`each: input.NAME` must be declared by the input schema, as a list, when the flow has
    one (without one, only the run's input can tell)."""
    if schema is None:
        return
    raw_properties, raw_required = schema.get("properties"), schema.get("required")
    properties: dict[str, Any] = raw_properties if isinstance(raw_properties, dict) else {}
    required: list[Any] = raw_required if isinstance(raw_required, list) else []
    if name not in properties and name not in required:
        declared = ", ".join(sorted({*properties, *map(str, required)})) or "none"
        raise _problem(f"input.{name} is not in the flow's input schema (it declares: {declared})")
    declared_type = properties.get(name, {}).get("type") if isinstance(properties.get(name), dict) else None
    if declared_type is not None:
        types_ = declared_type if isinstance(declared_type, list) else [declared_type]
        if "array" not in types_:
            raise _problem(f"input.{name} is declared as {declared_type!r}, not a list (array)")


# --------------------------------------------------------------------------- models


class StepSpec(BaseModel):
    """One step of a flow as written (before `each` expands it into run steps)."""

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    agent: Annotated[str, Says("agent is an agent name", missing="a step needs 'agent:'")] = Field(min_length=1)
    instruction: Annotated[str, Says("instruction is text", null_ok=True)] = ""
    # "input.NAME" or the items themselves
    each: Annotated[str | list[Any] | None, Says("each is input.NAME or a list of items")] = None
    parallel: Annotated[int | None, Says("parallel is a whole number of at least 1")] = Field(default=None, ge=1)
    on_fail: Annotated[str | None, Says("on_fail is an agent name")] = Field(default=None, min_length=1)
    until: Annotated[str | None, Says("until is the marker text that ends the loop")] = None
    loop: Annotated[str | None, Says("loop is an agent name")] = Field(default=None, min_length=1)
    max_cycles: Annotated[int | None, Says(f"max_cycles is a whole number from 1 to {MAX_CYCLES_LIMIT}")] = Field(
        default=None, ge=1, le=MAX_CYCLES_LIMIT
    )  # DEFAULT_MAX_CYCLES when `until` is set
    output: Annotated[Literal["text", "json"], Says("output is 'text' or 'json'")] = "text"
    schema_: Annotated[dict[str, Any] | None, Says("schema is a file path (schemas/x.json) or an inline JSON Schema")] = Field(
        default=None, alias="schema"
    )  # resolved
    schema_ref: str | None = None  # the path as written, when `schema:` is a path
    verify_judge: str | None = None
    optional: Annotated[bool, Says("optional is true or false")] = False
    retries: Annotated[int, Says("retries is a whole number of at least 0")] = Field(default=DEFAULT_RETRIES, ge=0)
    handoff: Annotated[Literal["results", "conclusions", "data", "none"], Says(f"handoff is one of {', '.join(HANDOFFS)}")] = (
        "results"
    )
    model: Annotated[str | None, Says("model is a model name")] = Field(default=None, min_length=1)
    line: int | None = None

    @field_validator("instruction", mode="before")
    @classmethod
    def _no_instruction(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("agent", "on_fail", "loop")
    @classmethod
    def _known_agent(cls, name: str | None, info: ValidationInfo) -> str | None:
        written = _as_written(info)
        if written is not None and name is not None and not has_agent(written.ws, name):
            raise _problem(f"unknown agent {name!r} (agents/{name}/agent.md not found)")
        return name

    @field_validator("until")
    @classmethod
    def _marker(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("a blank marker")
        return value

    @field_validator("each", mode="before")
    @classmethod
    def _fan_out(cls, value: Any, info: ValidationInfo) -> Any:
        """As written, `each` is `input.NAME` (declared as a list by the input schema, when
        there is one), a list of items, or that list as JSON text; the items must be
        keepable, and there must be some."""
        written = _as_written(info)
        if written is None:
            return value
        if isinstance(value, str):
            m = _EACH_INPUT.match(value.strip())
            if m:
                _check_each_input(written.input_schema, m.group(1))
                return value.strip()
            try:
                items = jsonsafe.parse(value)
            except json.JSONDecodeError:
                items = None
            except jsonsafe.Refusal as refused:
                raise _problem(refused.reason, refused.path[1:] if refused.parts else "") from None
            if not isinstance(items, list):
                raise ValueError("neither input.NAME nor a list")
            value = items
        if isinstance(value, list):
            if not value:
                raise _problem("each is an empty list, so the step would never run")
            _keepable(value)
        return value

    @field_validator("schema_")
    @classmethod
    def _inline_schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if _as_written(info) is not None and value is not None:
            _valid_schema(value, lambda path: "")
        return value

    @property
    def each_input(self) -> str | None:
        """NAME when the step fans out over `input.NAME`."""
        if isinstance(self.each, str):
            m = _EACH_INPUT.match(self.each)
            return m.group(1) if m else None
        return None


class Entry(BaseModel):
    """One entry of `steps:`: one group of steps run at once, or an approval."""

    index: int  # position in steps:
    kind: Literal["steps", "approval"]
    steps: list[StepSpec] = Field(default_factory=list)
    approval: str | None = None
    line: int | None = None


class ThenSpec(BaseModel):
    """`then:`: the flow a completed run of this one starts, and its input (placeholders
    filled from the finished run: `domain/chain.py`)."""

    flow: str
    input: dict[str, Any] = Field(default_factory=dict)


class Flow(BaseModel):
    """A valid flow."""

    name: str
    path: str  # "flows/<name>.yaml"
    description: Annotated[str, Says("expected text", null_ok=True)] = ""
    budget: Annotated[float | None, Says("budget is a number of USD greater than 0")] = Field(
        default=None, gt=0, allow_inf_nan=False
    )
    input_schema: Annotated[dict[str, Any] | None, Says("input is a JSON Schema (a mapping)")] = None  # `input:`
    entries: list[Entry]
    # checked by flow_check (it needs the steps' agents)
    then: Annotated[ThenSpec | None, Says("then is a mapping {flow: NAME, input: {...}}")] = None

    @field_validator("description", mode="before")
    @classmethod
    def _no_description(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("input_schema")
    @classmethod
    def _input_schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if _as_written(info) is not None and value is not None:
            _valid_schema(value, lambda path: "".join(f"[{p!r}]" if _is_int(p) else f".{p}" for p in path))
        return value

    def spec(self, entry: int, slot: int) -> StepSpec:
        """The flow settings of the step at an entry's slot (what a run step was made from)."""
        return next(e for e in self.entries if e.index == entry).steps[slot]


# --------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value)


def _schema_problem(schema: Any) -> SchemaError | None:
    """The first reason `schema` is not a valid JSON Schema, or None."""
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as e:
        return e
    return None


# --------------------------------------------------------------------------- public


def load_flow(ws: Workspace, name: str) -> Flow:
    """Read and validate `flows/<name>.yaml`, resolving schema files.

    Raises `FlowInvalid` listing every problem found (file, line, field): YAML syntax,
    unknown keys (with the closest known key), wrong types, unknown agents, a `loop` to an
    agent not at or before its entry, `loop`/`until` without the other, cycle limits,
    `each` on an input the schema does not declare, bad schema files, misplaced keys."""
    from laneflow.domain.flow_check import read_flow  # the checker builds on the models above

    return read_flow(ws, name)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, int | None, str | None, str, str]] = set()
    out = []
    for p in problems:
        key = (p.file, p.line, p.field, p.message, p.severity)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _json_path(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if _is_int(p) else f".{p}" for p in path)


def validate_input(flow: Flow, data: Any) -> None:
    """Check a run's input against the flow: its `input:` schema, and that every
    `each: input.NAME` names a list in it.

    Raises `RunInputInvalid` listing every problem, each with the JSON path of the field
    (`$.topics[0]`) as its field and `input` as its file."""
    problems: list[Problem] = []
    if flow.input_schema is not None:
        validator = validators.validator_for(flow.input_schema)(flow.input_schema)
        for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
            problems.append(Problem(file="input", field=_json_path(error.absolute_path), message=error.message))
    for entry in flow.entries:
        for step in entry.steps:
            name = step.each_input
            if name is None:
                continue
            where = f"steps[{entry.index}] ({step.agent}) fans out over input.{name}"
            if not isinstance(data, dict) or name not in data:
                problems.append(Problem(file="input", field=f"$.{name}", message=f"missing; {where}"))
            elif not isinstance(data[name], list):
                problems.append(
                    Problem(file="input", field=f"$.{name}", message=f"must be a list, got {_shown(data[name])}; {where}")
                )
    problems = _dedupe(problems)
    if problems:
        raise RunInputInvalid(f"the input does not fit flow {flow.name!r}", problems)


def check_workspace(root: str | Path, account: str | Path | None = None) -> list[Problem]:
    """Every problem of a workspace (`laneflow check`): errors and warnings of AGENTS.md,
    every agent.md and skill, and every flow. Collects; never raises for a problem in a
    file. Raises `WorkspaceInvalid` only when there is no workspace at `root`."""
    ws, problems = _read_workspace(root, account)
    problems = problems + ws.warnings
    for name in ws.agent_names:
        try:
            problems += load_agent(ws, name).warnings
        except WorkspaceInvalid as e:
            problems += e.problems
    for name in ws.flow_names:
        try:
            load_flow(ws, name)
        except FlowInvalid as e:
            problems += e.problems
    return problems


def step_spec(run: Run, step: Step) -> StepSpec:
    return Flow.model_validate(run.flow_spec).spec(step.entry, step.slot)
