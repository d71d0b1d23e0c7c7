"""Reading template.yaml: the functions the state machine calls and its definition with the
substitutions resolved. The local engine wires itself from this file, so it cannot drift
from what `sam deploy` creates."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class _CfnLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML with CloudFormation's short tags (!Ref, !GetAtt, !Sub, ...) read as plain data;
    by libyaml where PyYAML has it (the pure-Python loader took ~0.08 s of CPU of every
    engine and step worker to read template.yaml's 70 KB, libyaml ~0.01 s)."""


def _cfn_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)  # the only other kind of node
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    code_dir: Path
    handler: str  # module.function, e.g. app.handler


@dataclass(frozen=True)
class Template:
    path: Path
    body: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> Template:
        path = Path(path)
        with path.open(encoding="utf-8") as fh:
            return cls(path=path, body=yaml.load(fh, Loader=_CfnLoader))  # SafeLoader subclass

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.body.get("Resources", {})
        return resources

    def functions(self) -> dict[str, FunctionSpec]:
        default_handler = self.body.get("Globals", {}).get("Function", {}).get("Handler", "app.handler")
        out = {}
        for logical_id, res in self.resources.items():
            if res.get("Type") != "AWS::Serverless::Function":
                continue
            props = res.get("Properties", {})
            out[logical_id] = FunctionSpec(
                logical_id=logical_id,
                code_dir=(self.path.parent / props["CodeUri"]).resolve(),
                handler=props.get("Handler", default_handler),
            )
        return out

    def state_machine(self, logical_id: str = "FlowStateMachine") -> tuple[Path, dict[str, Any]]:
        props = self.resources[logical_id]["Properties"]
        return (self.path.parent / props["DefinitionUri"]).resolve(), props.get("DefinitionSubstitutions", {})

    def _resolve(self, value: Any, arn_for: Callable[[str], str]) -> str:
        """A substitution's value: a resource's ARN (`arn_for`), a parameter's default, or a
        `!Join` of those (a parameter's list joined), or an `!If` as the defaults decide it."""
        if isinstance(value, dict) and "Fn::If" in value:
            condition, then, otherwise = value["Fn::If"]
            return self._resolve(then if self._holds(condition) else otherwise, arn_for)
        if isinstance(value, dict) and "Fn::GetAtt" in value:
            return arn_for(value["Fn::GetAtt"][0])
        if isinstance(value, dict) and "Ref" in value:
            param = self.body.get("Parameters", {}).get(value["Ref"])
            return str(param.get("Default", "")) if param is not None else arn_for(value["Ref"])
        if isinstance(value, dict) and "Fn::Join" in value:
            sep, parts = value["Fn::Join"]
            parts = parts if isinstance(parts, list) else [parts]
            return str(sep).join(self._resolve(p, arn_for) for p in parts)
        return str(value)

    def _holds(self, condition: Any) -> bool:
        """A condition (its name, or `!Not`, `!And`, `!Or`, `!Equals`) as the parameters'
        defaults decide it."""
        if isinstance(condition, str):
            return self._holds(self.body.get("Conditions", {})[condition])
        [(op, args)] = condition.items()
        if op == "Condition":
            return self._holds(args)
        if op in ("Fn::And", "Fn::Or"):
            return (all if op == "Fn::And" else any)(self._holds(a) for a in args)
        if op == "Fn::Not":
            return not self._holds(args[0])
        if op == "Fn::Equals":
            return self._resolve(args[0], str) == self._resolve(args[1], str)
        raise ValueError(f"template.yaml: a condition of {op} cannot be read here")

    def definition(
        self, arn_for: Callable[[str], str], logical_id: str = "FlowStateMachine", *, values: dict[str, str] | None = None
    ) -> str:
        """The state machine's definition with every `${Name}` substituted. `arn_for` turns a
        function's logical id into the ARN the engine answers to."""
        path, subs = self.state_machine(logical_id)
        given = values or {}  # substitutions given as they are (a test's own cluster, subnets)
        resolved = {name: given.get(name) or self._resolve(value, arn_for) for name, value in subs.items()}
        text = path.read_text(encoding="utf-8")
        missing = sorted(set(re.findall(r"\$\{(\w+)\}", text)) - set(resolved))
        if missing:
            raise ValueError(f"{path.name}: no DefinitionSubstitutions for {', '.join(missing)}")
        text = re.sub(r"\$\{(\w+)\}", lambda m: resolved[m.group(1)], text)
        json.loads(text)  # it must still be JSON
        return text
