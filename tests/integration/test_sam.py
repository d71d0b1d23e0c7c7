"""SAM itself on the template: `sam validate --lint` passes on it and fails on a broken copy,
needing a region but no credentials; `sam build` builds every function and the layer, and
what it built is what Lambda runs: each function's handler, the layer's laneflow package,
and the layer's dependencies as CPython 3.12 arm64 wheels (the runtime and architecture the
template names) without what the layer leaves out.

The build needs no python3.12 on PATH (every function and the layer build with make, pip
fetching the layer's wheels for the runtime), so it runs on this machine's Python. The SAM
CLI is the one `make setup` installs in .venv-sam (requirements-sam.txt), else `sam` on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from laneflow.adapters.engine.template import Template

pytestmark = pytest.mark.slow

TEMPLATE = Template.load(ROOT / "template.yaml")

# What pyproject's [tool.laneflow.layer] leave-out keeps out of the layer, and the dev tools.
LEFT_OUT = ("boto3", "moto", "jsonpath_ng", "rich", "laneflow_dev")


def _sam() -> str:
    own = ROOT / ".venv-sam" / "bin" / "sam"
    found = str(own) if own.exists() else shutil.which("sam")
    if found is None:
        pytest.skip("no SAM CLI: `make setup` installs it in .venv-sam (requirements-sam.txt)")
    return found


def _env(home: Path) -> dict[str, str]:
    """This environment without AWS credentials or profiles (a HOME of its own has no
    ~/.aws), and without SAM's telemetry. SAM's settings there say it looked for a newer
    version just now: it looks at most weekly, and the look is a request this test has no use
    for (without an answer it waits 5 s)."""
    settings = home / ".aws-sam" / "metadata.json"
    if not settings.exists():
        settings.parent.mkdir(parents=True)
        settings.write_text(json.dumps({"lastVersionCheck": time.time(), "telemetryEnabled": False}), encoding="utf-8")
    kept = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_CA_BUNDLE"}
    return {**kept, "HOME": str(home), "SAM_CLI_TELEMETRY": "0"}


def _run(*args: str, cwd: Path, home: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_sam(), *args], cwd=cwd, env=_env(home), capture_output=True, text=True, timeout=timeout, check=False)


def test_sam_validate_lint_passes_on_the_template_without_credentials_and_fails_on_a_broken_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _run(
        "validate",
        "--lint",
        "--region",
        "us-east-1",
        "--template-file",
        str(ROOT / "template.yaml"),
        cwd=ROOT,
        home=home,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is a valid SAM Template" in done.stdout + done.stderr

    # A copy whose only change is an alarm comparing in a way CloudWatch does not know.
    text = (ROOT / "template.yaml").read_text(encoding="utf-8")
    assert text.count("ComparisonOperator: LessThanThreshold") == 1
    broken = tmp_path / "template.yaml"
    broken.write_text(text.replace("ComparisonOperator: LessThanThreshold", "ComparisonOperator: BelowZero"), encoding="utf-8")
    shutil.copytree(ROOT / "statemachines", tmp_path / "statemachines")
    done = _run(
        "validate", "--lint", "--region", "us-east-1", "--template-file", str(broken), cwd=tmp_path, home=home, timeout=180
    )
    assert done.returncode != 0
    assert "E3030" in done.stdout + done.stderr and "BelowZero" in done.stdout + done.stderr


def _functions() -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in TEMPLATE.resources.items() if v["Type"] == "AWS::Serverless::Function"}


def _has_each_functions_handler(built: Path) -> None:
    globals_ = TEMPLATE.body["Globals"]["Function"]
    out = Template.load(built / "template.yaml").resources
    assert _functions()
    for logical_id, props in _functions().items():
        module, _, function = props.get("Handler", globals_["Handler"]).rpartition(".")
        artifact = built / logical_id / f"{module}.py"
        source = ROOT / props["CodeUri"] / f"{module}.py"
        assert artifact.read_bytes() == source.read_bytes(), logical_id
        assert f"\ndef {function}(" in artifact.read_text(encoding="utf-8"), f"{logical_id}: no {function}() in {module}.py"
        assert out[logical_id]["Properties"]["CodeUri"] == logical_id  # the built template deploys it


def _has_the_layers_laneflow_package_under_python(built: Path) -> None:
    package = built / "LaneflowLayer" / "python" / "laneflow"
    source = ROOT / TEMPLATE.resources["LaneflowLayer"]["Properties"]["ContentUri"] / "laneflow"
    expected = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    got = sorted(p.relative_to(package) for p in package.rglob("*") if p.is_file())
    assert got == expected
    assert all((package / rel).read_bytes() == (source / rel).read_bytes() for rel in expected)


def _has_wheels_for_the_templates_runtime_and_architecture(built: Path) -> None:
    runtime = TEMPLATE.body["Globals"]["Function"]["Runtime"]
    [arch] = TEMPLATE.body["Globals"]["Function"]["Architectures"]
    tag = f"cpython-{runtime.removeprefix('python').replace('.', '')}-{'aarch64' if arch == 'arm64' else 'x86_64'}-linux-gnu"
    layer = built / "LaneflowLayer" / "python"
    extensions = [p.name for p in layer.rglob("*.so") if ".cpython-" in p.name]
    assert any(name.startswith("_pydantic_core.") for name in extensions)  # pydantic's compiled core is there
    assert all(tag in name for name in extensions), [n for n in extensions if tag not in n]
    assert (layer / "aws_lambda_powertools").is_dir() and (layer / "anthropic").is_dir()
    assert not [name for name in LEFT_OUT if (layer / name).exists()]


def test_sam_build_builds_each_handler_and_the_layer_with_its_laneflow_and_wheels_for_the_runtime(tmp_path: Path) -> None:
    """One build (it takes a while), checked three ways."""
    build = tmp_path / "build"
    args = ["build", "--template-file", str(ROOT / "template.yaml"), "--build-dir", str(build)]
    # From a folder of its own, where SAM leaves its .aws-sam/deps and build.toml: the checkout
    # stays as it was (samconfig.toml, beside the template, is still read).
    done = _run(
        *args, "--cache-dir", str(tmp_path / "cache"), "--region", "us-east-1", cwd=tmp_path, home=tmp_path / "home", timeout=600
    )
    assert done.returncode == 0, f"sam build exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert "Build Succeeded" in done.stdout + done.stderr
    _has_each_functions_handler(build)
    _has_the_layers_laneflow_package_under_python(build)
    _has_wheels_for_the_templates_runtime_and_architecture(build)


# SAM's own translator, in the SAM CLI's Python: the template as CloudFormation gets it, with
# the people API made (a user pool given) and the code's local paths as S3 ones, as
# `sam deploy` uploads them. Prints each REST API's name and its definition's title.
TRANSLATE = """
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class NoManagedPolicies:
    def load(self):
        return {}

template = yaml_parse(open(sys.argv[1]).read())
for resource in template["Resources"].values():
    props = resource.get("Properties", {})
    for key in ("CodeUri", "ContentUri", "DefinitionUri"):
        if isinstance(props.get(key), str):
            props[key] = "s3://bucket/key"
pool = "arn:aws:cognito-idp:us-east-1:123456789012:userpool/us-east-1_x"
out = transform(template, {"PeopleUserPoolArn": pool}, NoManagedPolicies())
print(json.dumps({
    k: {"name": v["Properties"].get("Name"), "title": v["Properties"]["Body"]["info"]["title"]}
    for k, v in out["Resources"].items() if v["Type"] == "AWS::ApiGateway::RestApi"
}))
"""


def test_the_5xx_alarms_name_each_rest_api_by_the_name_sam_gives_it(tmp_path: Path) -> None:
    """API Gateway publishes a REST API's metrics under its name, which, with no Name given,
    is its definition's title: SAM's for the IAM API, the template's own for the people API."""
    shebang = Path(_sam()).read_bytes().split(b"\n", 1)[0]
    if not shebang.startswith(b"#!") or b"python" not in shebang:
        pytest.skip(f"{_sam()} is not a Python script: its translator cannot be imported")
    python = shebang[2:].decode().strip()
    done = subprocess.run(
        [python, "-c", TRANSLATE, str(ROOT / "template.yaml")],
        env={**_env(tmp_path / "home"), "AWS_DEFAULT_REGION": "us-east-1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    apis = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(apis) == {"LaneflowApi", "PeopleApi"}
    alarms = [v for v in TEMPLATE.resources.values() if v["Type"] == "AWS::CloudWatch::Alarm"]
    named = [d["Value"] for a in alarms if a["Properties"].get("MetricName") == "5XXError" for d in a["Properties"]["Dimensions"]]
    for api, deployed in apis.items():
        assert deployed["name"] is None, api  # no Name: the title is the name
        assert deployed["title"] in named, f"no 5XX alarm on {api}'s name {deployed['title']}"
