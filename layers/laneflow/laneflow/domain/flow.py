"""Flows: `flows/<name>.yaml`, parsed and validated in full before a run starts (README,
"A flow" and "Flow control").

`load_flow` reads the YAML with its node tree, so every problem carries the line it is on,
and collects every problem before raising `FlowInvalid` with all of them: a person fixes
a flow in one go, not one error per try. `validate_input` checks a run's input against
the flow's `input:` schema; `check_workspace` is `laneflow check`: every problem of every
file, collected, never raised.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from jsonschema import validators
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field

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
    StrictLoader,
    UnfitValue,
    Workspace,
    _read_workspace,
    has_agent,
    load_agent,
    yaml_error_at,
)

__all__ = [
    "StepSpec",
    "Entry",
    "Flow",
    "load_flow",
    "validate_input",
    "check_workspace",
    "TOP_KEYS",
    "STEP_KEYS",
    "MAX_CYCLES_LIMIT",
    "DEFAULT_MAX_CYCLES",
]


TOP_KEYS = ("description", "budget", "input", "steps")

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



# --------------------------------------------------------------------------- models


class StepSpec(BaseModel):
    """One step of a flow as written (before `each` expands it into run steps)."""

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    agent: str
    instruction: str = ""
    each: str | list[Any] | None = None  # "input.NAME" or the items themselves
    parallel: int | None = None
    on_fail: str | None = None
    until: str | None = None
    loop: str | None = None
    max_cycles: int | None = None  # DEFAULT_MAX_CYCLES when `until` is set
    output: Literal["text", "json"] = "text"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # resolved
    schema_ref: str | None = None  # the path as written, when `schema:` is a path
    verify_judge: str | None = None
    optional: bool = False
    retries: int = DEFAULT_RETRIES
    handoff: Literal["results", "conclusions", "data", "none"] = "results"
    model: str | None = None
    line: int | None = None

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



class Flow(BaseModel):
    """A valid flow."""

    name: str
    path: str  # "flows/<name>.yaml"
    description: str = ""
    budget: float | None = None
    input_schema: dict[str, Any] | None = None
    entries: list[Entry]

    def spec(self, entry: int, slot: int) -> StepSpec:
        """The flow settings of the step at an entry's slot (what a run step was made from)."""
        return next(e for e in self.entries if e.index == entry).steps[slot]



# --------------------------------------------------------------------------- checking


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1



def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)



def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)



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



class _FlowChecker:
    """Walks a flow's YAML nodes, collecting every problem with its line and field."""

    def __init__(self, ws: Workspace, name: str, rel: str, loader: StrictLoader):
        self.ws = ws
        self.name = name
        self.rel = rel
        self.loader = loader
        self.problems: list[Problem] = []
        self.input_schema: dict[str, Any] | None = None
        self.has_input = False
        self.schema_files: dict[str, dict[str, Any] | None] = {}
        self.loops: list[tuple[int, str, int, str]] = []  # (entry, agent, line, field)
        self.entry_agents: list[set[str]] = []
        self.suggested: set[str] = set()  # fields a typo was taken for ("steps[0].agent")

    # -- helpers

    def error(self, line: int | None, field: str | None, message: str, file: str | None = None) -> None:
        self.problems.append(Problem(file=file or self.rel, line=line, field=field, message=message))

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def pairs(self, node: yaml.MappingNode, prefix: str, known: tuple[str, ...]) -> dict[str, tuple[int, yaml.Node]]:
        """A mapping's keys -> (key line, value node); reports unknown and repeated keys."""
        self.loader.flatten_mapping(node)  # `<<:` merge keys
        out: dict[str, tuple[int, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = str(self.value(key_node))
            field = f"{prefix}.{key}" if prefix else key
            if key in out:
                self.error(_line(key_node), field, f"key {key!r} is given twice")
                continue
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(_line(key_node), field, f"unknown key {key!r}{hint}")
                if close:
                    self.suggested.add(f"{prefix}.{close[0]}" if prefix else close[0])
                continue
            out[key] = (_line(key_node), value_node)
        return out

    def json_value(self, value: Any, line: int, field: str) -> bool:
        """Whether a value the run keeps as JSON (fan-out items, a schema) can be kept: no
        key that is not text, no date, no alias loop, within the depth and size bounds.
        Reports the first reason it cannot."""
        found = jsonsafe.refusal(value)
        if found is None:
            return True
        where = field + found.path[1:] if found.parts else field
        self.error(line, where, found.reason)
        return False

    def agent_ref(self, value: Any, line: int, field: str, what: str) -> str | None:
        if not isinstance(value, str) or not value:
            self.error(line, field, f"{what} is an agent name, got {_shown(value)}")
            return None
        if not has_agent(self.ws, value):
            self.error(line, field, f"unknown agent {value!r} (agents/{value}/agent.md not found)")
            return None
        return value

    # -- the flow

    def check(self, root: yaml.Node | None) -> dict[str, Any]:
        if root is None:
            self.error(1, "steps", "the flow is empty; it needs at least 'steps:'")
            return {}
        if not isinstance(root, yaml.MappingNode):
            self.error(_line(root), None, "a flow is a mapping with 'steps:' (and optionally description, budget, input)")
            return {}
        keys = self.pairs(root, "", TOP_KEYS)
        out: dict[str, Any] = {}
        if "description" in keys:
            line, node = keys["description"]
            value = self.value(node)
            if value is not None and not isinstance(value, str):
                self.error(line, "description", f"expected text, got {_shown(value)}")
            out["description"] = value or ""
        if "budget" in keys:
            line, node = keys["budget"]
            value = self.value(node)
            if not _is_number(value) or not 0 < value < math.inf:
                self.error(line, "budget", f"budget is a number of USD greater than 0, got {_shown(value)}")
            else:
                out["budget"] = float(value)
        if "input" in keys:  # before the steps: `each: input.NAME` is checked against it
            out["input_schema"] = self.check_input(*keys["input"])
        if "steps" not in keys:
            if "steps" not in self.suggested:
                self.error(_line(root), "steps", "the flow has no 'steps:'")
            return out
        line, node = keys["steps"]
        out["entries"] = self.check_steps(line, node)
        return out

    def check_input(self, line: int, node: yaml.Node) -> dict[str, Any] | None:
        self.has_input = True
        value = self.value(node)
        if not isinstance(value, dict):
            self.error(line, "input", f"input is a JSON Schema (a mapping), got {_shown(value)}")
            return None
        if not self.json_value(value, line, "input"):
            return None
        bad = _schema_problem(value)
        if bad is not None:
            where = "".join(f"[{p!r}]" if _is_int(p) else f".{p}" for p in bad.path)
            self.error(line, f"input{where}", f"not a valid JSON Schema: {bad.message}")
            return None
        self.input_schema = value
        return value

    def check_steps(self, line: int, node: yaml.Node) -> list[Entry]:
        if not isinstance(node, yaml.SequenceNode):
            self.error(line, "steps", f"steps is a list of entries, got {_shown(self.value(node))}")
            return []
        if not node.value:
            self.error(line, "steps", "steps is empty; a flow needs at least one step")
            return []
        entries = []
        for i, item in enumerate(node.value):
            self.entry_agents.append(set())
            entry = self.check_entry(i, item)
            if entry is not None:
                entries.append(entry)
        self.check_loops()
        return entries

    def check_entry(self, index: int, node: yaml.Node) -> Entry | None:
        field = f"steps[{index}]"
        line = _line(node)
        if not isinstance(node, yaml.MappingNode):
            self.error(
                line, field,
                f"an entry is a step (agent: ...), an approval: or a group:, got {_shown(self.value(node))}",
            )
            return None
        names = [str(self.value(k)) for k, _ in node.value]
        for kind in ("approval", "group"):
            if kind not in names:
                continue
            others = [n for n in names if n != kind]
            if others:
                listed = ", ".join(repr(n) for n in others)
                self.error(line, field, f"{kind}: stands alone in its entry; it cannot have {listed}")
            value_node = next(v for k, v in node.value if str(self.value(k)) == kind)
            if kind == "approval":
                question = self.value(value_node)
                if not isinstance(question, str) or not question.strip():
                    self.error(line, f"{field}.approval", f"approval is the question to ask, got {_shown(question)}")
                    return None
                return Entry(index=index, kind="approval", approval=question, line=line)
            return self.check_group(index, line, value_node)
        step = self.check_step(index, node, field)
        return Entry(index=index, kind="steps", steps=[step], line=line) if step else None

    def check_group(self, index: int, line: int, node: yaml.Node) -> Entry | None:
        field = f"steps[{index}].group"
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            value = self.value(node)
            if isinstance(value, list):
                self.error(line, field, "group is empty; it needs at least one step")
            else:
                self.error(line, field, f"group is a list of steps, got {_shown(value)}")
            return None
        steps: list[StepSpec] = []
        for j, item in enumerate(node.value):
            item_field = f"{field}[{j}]"
            if not isinstance(item, yaml.MappingNode):
                self.error(_line(item), item_field, f"a group holds steps (agent: ...), got {_shown(self.value(item))}")
                continue
            inner = {str(self.value(k)) for k, _ in item.value}
            if inner & {"approval", "group"}:
                self.error(_line(item), item_field, "a group holds steps only: no approval: or group: inside a group")
                continue
            step = self.check_step(index, item, item_field)
            if step is not None:
                steps.append(step)
        if len(steps) != len(node.value):
            return None
        return Entry(index=index, kind="steps", steps=steps, line=line)

    def check_step(self, entry: int, node: yaml.MappingNode, field: str) -> StepSpec | None:
        before = len(self.problems)
        keys = self.pairs(node, field, STEP_KEYS)
        spec: dict[str, Any] = {"line": _line(node)}

        def get(key: str) -> tuple[int, Any] | None:
            if key not in keys:
                return None
            line, value_node = keys[key]
            return line, self.value(value_node)

        def f(key: str) -> str:
            return f"{field}.{key}"

        if (got := get("agent")) is None:
            if f("agent") not in self.suggested:  # else a typo ('agnet') is already reported
                self.error(_line(node), f("agent"), "a step needs 'agent:'")
        else:
            agent = self.agent_ref(got[1], got[0], f("agent"), "agent")
            if agent is not None:
                spec["agent"] = agent
                self.entry_agents[entry].add(agent)

        if (got := get("instruction")) is not None:
            line, value = got
            if value is not None and not isinstance(value, str):
                self.error(line, f("instruction"), f"instruction is text, got {_shown(value)}")
            spec["instruction"] = value or ""

        if (got := get("each")) is not None:
            spec["each"] = self.check_each(*got, f("each"))

        for key, minimum in (("parallel", 1), ("retries", 0)):
            if (got := get(key)) is not None:
                line, value = got
                if not _is_int(value) or value < minimum:
                    self.error(line, f(key), f"{key} is a whole number of at least {minimum}, got {_shown(value)}")
                else:
                    spec[key] = value

        if (got := get("on_fail")) is not None:
            spec["on_fail"] = self.agent_ref(got[1], got[0], f("on_fail"), "on_fail")

        until, loop = get("until"), get("loop")
        if until is not None:
            line, value = until
            if not isinstance(value, str) or not value.strip():
                self.error(line, f("until"), f"until is the marker text that ends the loop, got {_shown(value)}")
            else:
                spec["until"] = value
        if loop is not None:
            line, value = loop
            name = self.agent_ref(value, line, f("loop"), "loop")
            if name is not None:
                spec["loop"] = name
                self.loops.append((entry, name, line, f("loop")))
        if until is not None and loop is None:
            self.error(until[0], f("until"), "until needs loop: (the agent whose group runs again)")
        if loop is not None and until is None:
            self.error(loop[0], f("loop"), "loop needs until: (the marker that ends the loop)")

        if (got := get("max_cycles")) is not None:
            line, value = got
            if not _is_int(value) or not 1 <= value <= MAX_CYCLES_LIMIT:
                self.error(line, f("max_cycles"),
                           f"max_cycles is a whole number from 1 to {MAX_CYCLES_LIMIT}, got {_shown(value)}")
            elif until is None:
                self.error(line, f("max_cycles"), "max_cycles applies only to a loop (until: and loop:)")
            else:
                spec["max_cycles"] = value
        elif until is not None:
            spec["max_cycles"] = DEFAULT_MAX_CYCLES

        output = get("output")
        if output is not None:
            line, value = output
            if value not in OUTPUTS:
                self.error(line, f("output"), f"output is 'text' or 'json', got {_shown(value)}")
            else:
                spec["output"] = value
        if (got := get("schema")) is not None:
            line, value = got
            if output is None or output[1] != "json":
                self.error(line, f("schema"), "schema applies only with output: json")
            if isinstance(value, str):
                spec["schema_ref"] = value
                spec["schema"] = self.schema_file(value, line, f("schema"))
            elif isinstance(value, dict):
                if self.json_value(value, line, f("schema")):
                    bad = _schema_problem(value)
                    if bad is not None:
                        self.error(line, f("schema"), f"not a valid JSON Schema: {bad.message}")
                spec["schema"] = value
            else:
                self.error(line, f("schema"),
                           f"schema is a file path (schemas/x.json) or an inline JSON Schema, got {_shown(value)}")

        if "verify" in keys:
            spec["verify_judge"] = self.check_verify(*keys["verify"], f("verify"))

        if (got := get("optional")) is not None:
            line, value = got
            if not isinstance(value, bool):
                self.error(line, f("optional"), f"optional is true or false, got {_shown(value)}")
            else:
                spec["optional"] = value

        if (got := get("handoff")) is not None:
            line, value = got
            if value not in HANDOFFS:
                self.error(line, f("handoff"), f"handoff is one of {', '.join(HANDOFFS)}, got {_shown(value)}")
            else:
                spec["handoff"] = value

        if (got := get("model")) is not None:
            line, value = got
            if not isinstance(value, str) or not value:
                self.error(line, f("model"), f"model is a model name, got {_shown(value)}")
            else:
                spec["model"] = value

        if len(self.problems) > before:
            return None
        return StepSpec.model_validate(spec)

    def check_each(self, line: int, value: Any, field: str) -> str | list[Any] | None:
        if isinstance(value, str):
            m = _EACH_INPUT.match(value.strip())
            if m:
                self.check_each_input(m.group(1), line, field)
                return value.strip()
            try:
                items = jsonsafe.parse(value)
            except json.JSONDecodeError:
                items = None
            except jsonsafe.Refusal as refused:
                self.error(line, field + refused.path[1:] if refused.parts else field, refused.reason)
                return None
            if not isinstance(items, list):
                self.error(line, field, f"each is input.NAME or a list of items, got {value!r}")
                return None
            value = items
        if not isinstance(value, list):
            self.error(line, field, f"each is input.NAME or a list of items, got {_shown(value)}")
            return None
        if not value:
            self.error(line, field, "each is an empty list, so the step would never run")
            return None
        if not self.json_value(value, line, field):
            return None
        return value

    def check_each_input(self, name: str, line: int, field: str) -> None:
        """`each: input.NAME` must be declared by the input schema, as a list, when the
        flow has one (without one, only the run's input can tell)."""
        schema = self.input_schema
        if schema is None:
            return
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        if name not in properties and name not in required:
            declared = ", ".join(sorted({*properties, *map(str, required)})) or "none"
            self.error(line, field, f"input.{name} is not in the flow's input schema (it declares: {declared})")
            return
        declared_type = properties.get(name, {}).get("type") if isinstance(properties.get(name), dict) else None
        if declared_type is not None:
            types_ = declared_type if isinstance(declared_type, list) else [declared_type]
            if "array" not in types_:
                self.error(line, field, f"input.{name} is declared as {declared_type!r}, not a list (array)")

    def check_verify(self, line: int, node: yaml.Node, field: str) -> str | None:
        if not isinstance(node, yaml.MappingNode):
            self.error(line, field, f"verify is a mapping such as {{judge: \"question\"}}, got {_shown(self.value(node))}")
            return None
        keys = self.pairs(node, field, VERIFY_KEYS)
        if "judge" not in keys:
            if f"{field}.judge" not in self.suggested:
                self.error(line, field, "verify needs judge: (the question the judge model answers)")
            return None
        judge_line, judge_node = keys["judge"]
        question = self.value(judge_node)
        if not isinstance(question, str) or not question.strip():
            self.error(judge_line, f"{field}.judge", f"judge is the question to ask, got {_shown(question)}")
            return None
        return question

    def schema_file(self, ref: str, line: int, field: str) -> dict[str, Any] | None:
        """Load a schema file named relative to the workspace; each file is read (and its
        problems reported) once per flow."""
        posix = PurePosixPath(ref.replace("\\", "/"))
        if posix.is_absolute() or ".." in posix.parts or not ref.strip():
            self.error(line, field, f"schema file {ref!r} must be a path inside the workspace (e.g. schemas/post.json)")
            return None
        rel = posix.as_posix()
        # A symlink (of the file or a folder on its way) may lead out of the workspace:
        # where it leads is checked before anything is read, and what is read is that.
        try:
            path = (self.ws.root / rel).resolve()
            inside = path.is_relative_to(Path(self.ws.root).resolve())
        except (OSError, RuntimeError):  # a symlink loop
            path, inside = self.ws.root / rel, False
        if not inside:
            self.error(line, field, f"schema file {rel} leads outside the workspace (a symlink); it is not read")
            return None
        if not path.is_file():
            self.error(line, field, f"schema file {rel} not found")
            return None
        if rel in self.schema_files:
            return self.schema_files[rel]
        self.schema_files[rel] = None
        used_by = f"(the schema of {field.removesuffix('.schema')} in {self.rel})"
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            self.error(None, None, f"schema file cannot be read: {e} {used_by}", file=rel)
            return None
        try:
            schema = jsonsafe.parse(text)
        except json.JSONDecodeError as e:
            self.error(e.lineno, None, f"schema file is not valid JSON: {e.msg} {used_by}", file=rel)
            return None
        except jsonsafe.Refusal as e:
            self.error(None, e.path if e.parts else None, f"schema file refused: {e.reason} {used_by}", file=rel)
            return None
        if not isinstance(schema, dict):
            self.error(1, None, f"schema file is not a JSON Schema object {used_by}", file=rel)
            return None
        bad = _schema_problem(schema)
        if bad is not None:
            where = "$" + "".join(f"[{p}]" if _is_int(p) else f".{p}" for p in bad.path)
            self.error(None, where, f"not a valid JSON Schema: {bad.message} {used_by}", file=rel)
            return None
        self.schema_files[rel] = schema
        return schema

    def check_loops(self) -> None:
        """`loop: X` goes back to X's group, so X must run in this entry or an earlier one."""
        for entry, agent, line, field in self.loops:
            earlier = set().union(*self.entry_agents[: entry + 1])
            if agent not in earlier:
                self.error(line, field, f"loop goes back to {agent!r}, which is not a step of this or an earlier entry")



# --------------------------------------------------------------------------- public


def load_flow(ws: Workspace, name: str) -> Flow:
    """Read and validate `flows/<name>.yaml`, resolving schema files.

    Raises `FlowInvalid` listing every problem found (file, line, field): YAML syntax,
    unknown keys (with the closest known key), wrong types, unknown agents, a `loop` to an
    agent not at or before its entry, `loop`/`until` without the other, cycle limits,
    `each` on an input the schema does not declare, bad schema files, misplaced keys."""
    rel = f"flows/{name}.yaml"
    path = ws.root / rel
    if not isinstance(name, str) or not _FLOW_NAME.match(name) or not path.is_file():
        raise FlowInvalid(f"no flow {name!r} ({rel} not found)")
    try:
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise FlowInvalid(f"flow {name!r} is not valid",
                          [Problem(file=rel, message=f"not UTF-8 text (byte {e.start})")]) from None
    loader: StrictLoader | None = None
    try:
        loader = StrictLoader(text)  # reads the text at once: a control character fails here
        root = loader.get_single_node()
        checker = _FlowChecker(ws, name, rel, loader)
        parts = checker.check(root)
    except yaml.YAMLError as e:
        at, what = yaml_error_at(e, text)
        message = what if isinstance(e, UnfitValue) else f"YAML does not parse: {what}"
        raise FlowInvalid(
            f"flow {name!r} is not valid",
            [Problem(file=rel, line=at + 1 if at is not None else None, message=message)],
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    # In file order: the flow's own problems by line, then those of its schema files.
    problems = sorted(_dedupe(checker.problems), key=lambda p: (p.file != rel, p.file, p.line or 0))
    if problems:
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        raise FlowInvalid(f"flow {name!r} is not valid ({count})", problems)
    return Flow(name=name, path=rel, **parts)



def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple] = set()
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
                problems.append(Problem(file="input", field=f"$.{name}",
                                        message=f"must be a list, got {_shown(data[name])}; {where}"))
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
