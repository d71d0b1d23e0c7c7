"""Checking a flow file: its YAML node tree walked for structure (entries, groups, unknown
and repeated keys, keys that mean nothing without another, schema files), each step's and
the flow's own fields validated against the models' constraints (`laneflow.domain.flow`),
and each refusal turned into a problem with its file, line and field.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from laneflow.domain import jsonsafe
from laneflow.domain.chain import placeholders
from laneflow.domain.errors import FlowInvalid, Problem
from laneflow.domain.flow import (
    _FLOW_NAME,
    DEFAULT_MAX_CYCLES,
    PROBLEM,
    STEP_KEYS,
    THEN_KEYS,
    TOP_KEYS,
    VERIFY_KEYS,
    AsWritten,
    Entry,
    Flow,
    Says,
    StepSpec,
    ThenSpec,
    _dedupe,
    _is_int,
    _schema_problem,
    _shown,
)
from laneflow.domain.frontmatter import StrictLoader, UnfitValue, unreadable, within, yaml_error_at
from laneflow.domain.workspace import Workspace

__all__ = ["read_flow"]

_M = TypeVar("_M", bound=BaseModel)

# The order a step's and a flow's keys are reported in (unknown keys first), whatever
# order they are written or validated in.
_STEP_ORDER = (
    "agent",
    "instruction",
    "each",
    "parallel",
    "retries",
    "on_fail",
    "until",
    "loop",
    "max_cycles",
    "output",
    "schema",
    "verify",
    "optional",
    "handoff",
    "model",
)

_TOP_ORDER = ("description", "budget", "input")

_TOP_FIELDS = {"description": "description", "budget": "budget", "input": "input_schema"}  # written key -> field


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _field_info(model: type[BaseModel], name: str) -> FieldInfo | None:
    fields = model.model_fields
    return fields.get(name) or next((f for f in fields.values() if f.alias == name), None)


def says(model: type[BaseModel], name: str) -> Says:
    """What a model's field takes, in words (its `Says` marker)."""
    info = _field_info(model, name)
    found = [m for m in info.metadata if isinstance(m, Says)] if info is not None else []
    return found[0] if found else Says(f"{name} is not valid")


class _FlowChecker:
    """Walks a flow's YAML nodes, collecting every problem with its line and field."""

    def __init__(self, ws: Workspace, name: str, rel: str, loader: StrictLoader):
        self.ws = ws
        self.name = name
        self.rel = rel
        self.loader = loader
        self.problems: list[Problem] = []
        self.written = AsWritten(ws=ws)
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

    def validated(
        self,
        model: type[_M],
        written: dict[str, Any],
        lines: dict[str, int],
        prefix: str,
        line: int,
        *,
        fields: dict[str, str] | None = None,
        base: dict[str, Any] | None = None,
    ) -> tuple[_M | None, set[str]]:
        """Validate what was written (key -> value; `fields` names the field a key fills
        when it differs) against the model's own constraints, strictly (YAML already gives
        typed values: "30" for a number is a mistake, not text to convert). Each refusal is
        a problem on its key's line: in the model's words (`Says`), or its validator's.
        Returns the model (None if anything was refused) and the keys refused."""
        fields = fields or {}
        keys = {fields.get(key, key): key for key in written}  # field -> written key
        refused: set[str] = set()
        data = dict(base or {})
        for key, value in written.items():
            if value is None and not says(model, fields.get(key, key)).null_ok:
                self.error(lines.get(key, line), prefix + key, f"{says(model, fields.get(key, key)).text}, got nothing")
                refused.add(key)
            else:
                data[fields.get(key, key)] = value
        try:
            validated = model.model_validate(data, strict=True, context={"written": self.written})
        except ValidationError as e:
            for err in e.errors():
                name = str(err["loc"][0]) if err["loc"] else ""
                key = keys.get(name, name)
                if err["type"] == PROBLEM:
                    ctx = err.get("ctx") or {}
                    self.error(lines.get(key, line), prefix + key + str(ctx.get("at", "")), str(ctx.get("problem")))
                elif err["type"] == "missing":
                    # else written as null, or a typo ('agnet'), already reported
                    if key not in refused and prefix + key not in self.suggested:
                        self.error(line, prefix + key, says(model, name).missing or f"'{key}:' is needed")
                elif key not in refused:  # one problem per key (a union refuses once per member)
                    self.error(lines.get(key, line), prefix + key, f"{says(model, name).text}, got {_shown(written.get(key))}")
                refused.add(key)
            return None, refused
        return (None if refused else validated), refused

    def in_order(self, start: int, prefix: str, order: tuple[str, ...]) -> None:
        """Put the problems added since `start` in the order of their keys (`prefix` is
        the mapping's field, such as "steps[0]."); a schema file's own problems come with
        `schema:` (and sort after the flow's anyway)."""

        def rank(problem: Problem) -> int:
            if problem.file != self.rel:
                return order.index("schema") if "schema" in order else -1
            key = (problem.field or "").removeprefix(prefix).split(".")[0].split("[")[0]
            return order.index(key) if key in order else -1

        self.problems[start:] = sorted(self.problems[start:], key=rank)

    # -- the flow

    def check(self, root: yaml.Node | None) -> dict[str, Any]:
        if root is None:
            self.error(1, "steps", "the flow is empty; it needs at least 'steps:'")
            return {}
        if not isinstance(root, yaml.MappingNode):
            self.error(_line(root), None, "a flow is a mapping with 'steps:' (and optionally description, budget, input)")
            return {}
        keys = self.pairs(root, "", TOP_KEYS)
        written = {key: self.value(node) for key, (_, node) in keys.items() if key not in ("steps", "then")}
        lines = {key: key_line for key, (key_line, _) in keys.items()}
        start = len(self.problems)
        top, refused = self.validated(
            Flow, written, lines, "", _line(root), fields=_TOP_FIELDS, base={"name": self.name, "path": self.rel, "entries": []}
        )
        self.in_order(start, "", _TOP_ORDER)
        out: dict[str, Any] = {}
        if top is not None:
            out = {"description": top.description, "budget": top.budget, "input_schema": top.input_schema}
        if "input" in written and "input" not in refused:  # taken as written, whatever else was refused
            # before the steps: `each: input.NAME` is checked against it
            self.written = AsWritten(ws=self.ws, input_schema=written["input"])
        if "steps" not in keys:
            if "steps" not in self.suggested:
                self.error(_line(root), "steps", "the flow has no 'steps:'")
            return out
        line, node = keys["steps"]
        out["entries"] = self.check_steps(line, node)
        if "then" in keys:
            out["then"] = self.check_then(*keys["then"])
        return out

    def check_then(self, line: int, node: yaml.Node) -> ThenSpec | None:
        """`then: {flow: NAME, input: {...}}`: a flow of this workspace, and an input whose
        `{result.X}` / `{data.X}` name agents that are steps of this flow."""
        if not isinstance(node, yaml.MappingNode):
            self.error(
                line, "then", f"then is a mapping such as {{flow: publish, input: {{...}}}}, got {_shown(self.value(node))}"
            )
            return None
        keys = self.pairs(node, "then", THEN_KEYS)
        start = len(self.problems)
        name = self.check_then_flow(line, keys)
        run_input: Any = {}
        if "input" in keys:
            input_line, input_node = keys["input"]
            run_input = self.value(input_node)
            if not isinstance(run_input, dict):
                self.error(
                    input_line, "then.input", f"then.input is a mapping (the chained run's input), got {_shown(run_input)}"
                )
            elif (refused := jsonsafe.refusal(run_input)) is not None:
                self.error(input_line, "then.input" + (refused.path[1:] if refused.parts else ""), refused.reason)
            else:
                agents = set().union(*self.entry_agents) if self.entry_agents else set()
                for kind, agent in dict.fromkeys(placeholders(run_input)):
                    if agent not in agents:
                        listed = ", ".join(sorted(agents)) or "none"
                        self.error(
                            input_line,
                            "then.input",
                            f"{{{kind}.{agent}}} names agent {agent!r}, which is not a step of this flow (its agents: {listed})",
                        )
        if len(self.problems) != start or name is None:
            return None
        return ThenSpec(flow=name, input=run_input)

    def check_then_flow(self, line: int, keys: dict[str, tuple[int, yaml.Node]]) -> str | None:
        """`then.flow`: a flow of this workspace (the closest name suggested)."""
        if "flow" not in keys:
            if "then.flow" not in self.suggested:
                self.error(line, "then.flow", "then needs flow: (the flow a completed run starts)")
            return None
        flow_line, flow_node = keys["flow"]
        name = self.value(flow_node)
        if not isinstance(name, str) or not name.strip():
            self.error(flow_line, "then.flow", f"then.flow is a flow name, got {_shown(name)}")
            return None
        if name not in self.ws.flow_names:
            close = difflib.get_close_matches(name, self.ws.flow_names, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.error(flow_line, "then.flow", f"unknown flow {name!r} (flows/{name}.yaml not found){hint}")
            return None
        return name

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
                line,
                field,
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

    # -- a step

    def check_step(self, entry: int, node: yaml.MappingNode, field: str) -> StepSpec | None:
        start = len(self.problems)
        keys = self.pairs(node, field, STEP_KEYS)
        lines = {key: key_line for key, (key_line, _) in keys.items()}
        written = {key: self.value(value_node) for key, (_, value_node) in keys.items() if key != "verify"}
        extra: dict[str, Any] = {"line": _line(node)}  # what the model gets besides what was written
        if "schema" in written:
            self.check_schema(written, lines, field, extra)
        if "verify" in keys:
            judge = self.check_verify(*keys["verify"], f"{field}.verify")
            if judge is not None:
                extra["verify_judge"] = judge
        if "until" in written and "max_cycles" not in written:
            extra["max_cycles"] = DEFAULT_MAX_CYCLES
        spec, refused = self.validated(StepSpec, written, lines, f"{field}.", _line(node), base=extra)
        if "agent" in written and "agent" not in refused:
            self.entry_agents[entry].add(written["agent"])
        if "loop" in written and "loop" not in refused:
            self.loops.append((entry, written["loop"], lines["loop"], f"{field}.loop"))
        self.check_alone(written, refused, lines, field)
        self.in_order(start, f"{field}.", _STEP_ORDER)
        return spec if len(self.problems) == start else None

    def check_schema(self, written: dict[str, Any], lines: dict[str, int], field: str, extra: dict[str, Any]) -> None:
        """`schema:` is for JSON output, and is a file path (read and resolved here) or an
        inline schema (left in `written`, validated as the model's own)."""
        if written.get("output") != "json":
            self.error(lines["schema"], f"{field}.schema", "schema applies only with output: json")
        if not isinstance(written["schema"], str):
            return
        ref = written.pop("schema")
        extra["schema_ref"] = ref
        resolved = self.schema_file(ref, lines["schema"], f"{field}.schema")
        if resolved is not None:
            extra["schema"] = resolved

    def check_alone(self, written: dict[str, Any], refused: set[str], lines: dict[str, int], field: str) -> None:
        """Keys that mean nothing without another: a loop's two ends, cycles without a loop."""
        if "until" in written and "loop" not in written:
            self.error(lines["until"], f"{field}.until", "until needs loop: (the agent whose group runs again)")
        if "loop" in written and "until" not in written:
            self.error(lines["loop"], f"{field}.loop", "loop needs until: (the marker that ends the loop)")
        if "max_cycles" in written and "max_cycles" not in refused and "until" not in written:
            self.error(lines["max_cycles"], f"{field}.max_cycles", "max_cycles applies only to a loop (until: and loop:)")

    def check_verify(self, line: int, node: yaml.Node, field: str) -> str | None:
        if not isinstance(node, yaml.MappingNode):
            self.error(line, field, f'verify is a mapping such as {{judge: "question"}}, got {_shown(self.value(node))}')
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
        path = self.schema_path(ref, line, field)
        if path is None:
            return None
        rel = PurePosixPath(ref.replace("\\", "/")).as_posix()
        if rel in self.schema_files:
            return self.schema_files[rel]
        self.schema_files[rel] = None
        schema = self.read_schema(path, rel, f"(the schema of {field.removesuffix('.schema')} in {self.rel})")
        self.schema_files[rel] = schema
        return schema

    def schema_path(self, ref: str, line: int, field: str) -> Path | None:
        """Where a schema file named in a flow is, if it is a file inside the workspace."""
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
        return path

    def read_schema(self, path: Path, rel: str, used_by: str) -> dict[str, Any] | None:
        """A schema file's JSON Schema, or None with its problems reported in that file."""
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
        return schema

    def check_loops(self) -> None:
        """`loop: X` goes back to X's group, so X must run in this entry or an earlier one."""
        for entry, agent, line, field in self.loops:
            earlier = set().union(*self.entry_agents[: entry + 1])
            if agent not in earlier:
                self.error(line, field, f"loop goes back to {agent!r}, which is not a step of this or an earlier entry")


def read_flow(ws: Workspace, name: str) -> Flow:
    """`load_flow`: read and check `flows/<name>.yaml`; `FlowInvalid` with every problem."""
    rel = f"flows/{name}.yaml"
    path = ws.root / rel
    if not isinstance(name, str) or not _FLOW_NAME.match(name) or not path.is_file():
        known = sorted(p.stem for p in (ws.root / "flows").glob("*.yaml")) if (ws.root / "flows").is_dir() else []
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; its flows: {', '.join(known)}" if known else "")
        raise FlowInvalid(f"no flow {name!r} in {ws.name} ({rel} not found){hint}")
    try:
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise FlowInvalid(
            f"flow {name!r} is not valid", [Problem(file=rel, message=f"not UTF-8 text (byte {e.start})")]
        ) from None
    loader: StrictLoader | None = None
    try:
        loader = StrictLoader(text)  # reads the text at once: a control character fails here
        root = loader.get_single_node()
        unfit = unreadable(loader, root)  # each such value is then text: the walk below goes on
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
    # A value that could not be taken is said once: not again as the text it was made into.
    said = [Problem(file=rel, line=_line(u.node), field=u.field or None, message=u.message) for u in unfit]
    problems = said + [
        p for p in checker.problems if not (p.file == rel and p.field and any(within(p.field, u.field) for u in unfit))
    ]
    # In file order: the flow's own problems by line, then those of its schema files.
    problems = sorted(_dedupe(problems), key=lambda p: (p.file != rel, p.file, p.line or 0))
    if problems:
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        raise FlowInvalid(f"flow {name!r} is not valid ({count})", problems)
    return Flow(name=name, path=rel, **parts)
