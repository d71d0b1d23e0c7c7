"""The Lambda layer's requirements come from pyproject.toml's dependencies, not a hand copy:
the committed file is what the generator writes, and the generator leaves out exactly what
pyproject says the layer does without."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("layer_requirements", ROOT / "scripts" / "layer_requirements.py")
assert spec and spec.loader
layer_requirements = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layer_requirements)


def _requirements(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_committed_layer_requirements_are_what_pyproject_generates() -> None:
    committed = (ROOT / "layers" / "laneflow" / "requirements.txt").read_text(encoding="utf-8")
    assert committed == layer_requirements.render(), "out of date: run `make layer-requirements`"
    assert layer_requirements.main(["--check"]) == 0


def test_the_layer_ships_the_dependencies_in_their_order_less_the_engine_the_terminals_and_the_runtimes_boto3() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    shipped = _requirements(layer_requirements.render())
    assert shipped == [d for d in dependencies if not d.startswith(("boto3", "moto", "jsonpath-ng", "rich"))]
    assert "pydantic>=2.7,<3" in shipped and "aws-lambda-powertools[tracer]>=3.0" in shipped


def test_a_leave_out_that_names_no_dependency_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["boto3>=1", "moto[stepfunctions]==5.2.5"]\n'
        '[tool.laneflow.layer]\nleave-out = ["boto3", "mot0"]\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="leave-out names no dependency: mot0"):
        layer_requirements.render(pyproject)


def test_names_are_compared_as_pip_does(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["Jsonpath_NG>=1.16", "PyYAML>=6"]\n[tool.laneflow.layer]\nleave-out = ["jsonpath-ng"]\n',
        encoding="utf-8",
    )
    assert _requirements(layer_requirements.render(pyproject)) == ["PyYAML>=6"]
