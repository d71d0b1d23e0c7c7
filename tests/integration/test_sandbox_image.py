"""The sandbox worker's image, docker/sandbox/Dockerfile, read as the builder reads it (no
Docker engine runs here): it starts on the Lambda runtime's Python, copies only files the
checkout has and everything `pip install .` needs, starts the worker module the task
definition names, installs bubblewrap, and a build from exactly the files it copies gives a
laneflow with the worker and the project files. The stack runs it from its own registry
unless SandboxImage names another image, and the README's commands build it for the task's
architecture and push it where the stack looks."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

from laneflow.adapters.engine.template import Template

DOCKER = ROOT / "docker" / "sandbox"
DOCKERFILE = DOCKER / "Dockerfile"
TEMPLATE = Template.load(ROOT / "template.yaml")
[STEP] = TEMPLATE.resources["SandboxTaskDefinition"]["Properties"]["ContainerDefinitions"]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, continuation lines joined, comments dropped."""
    lines = [line for line in DOCKERFILE.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    parsed = [line.strip().split(None, 1) for line in joined.splitlines() if line.strip()]
    return [(words[0].upper(), words[1] if len(words) > 1 else "") for words in parsed]


def _all(name: str) -> list[str]:
    return [args for instruction, args in instructions() if instruction == name]


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY, in the shell form this Dockerfile uses."""
    found = []
    for args in _all("COPY"):
        assert not args.startswith(("[", "--")), f"COPY {args}: only the plain form is read here"
        *sources, destination = args.split()
        found.append((sources, destination))
    return found


def test_the_image_runs_the_python_of_the_lambda_runtime() -> None:
    [base] = _all("FROM")
    runtime = TEMPLATE.body["Globals"]["Function"]["Runtime"]  # python3.12
    assert re.fullmatch(rf"\S+/python:{re.escape(runtime.removeprefix('python'))}-slim", base), base
    assert not base.startswith("docker.io") and "/" in base  # a registry without Docker Hub's pull limits


def test_the_image_starts_the_worker_module_the_task_definition_names() -> None:
    [cmd] = _all("CMD")
    command = json.loads(cmd)
    assert command == STEP["Command"] == ["python", "-m", "laneflow.entrypoints.sandbox_worker"]
    module = ROOT / "layers" / "laneflow" / Path(*command[2].split(".")).with_suffix(".py")
    assert module.is_file(), module
    assert '\nif __name__ == "__main__":' in module.read_text(encoding="utf-8")


def _project_files() -> list[str]:
    """setup.py's PROJECT_FILES, the project files the wheel carries (read, not imported:
    importing setup.py runs the build)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    [value] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PROJECT_FILES"]
    ]
    return list(ast.literal_eval(value))


def test_every_file_the_image_copies_is_in_the_checkout_and_the_install_has_all_it_needs() -> None:
    steps = instructions()
    first_copy = [i for i, (instruction, _) in enumerate(steps) if instruction == "COPY"][0]
    assert any(instruction == "WORKDIR" for instruction, _ in steps[:first_copy])
    copied: set[str] = set()
    for sources, destination in copies():
        assert destination.startswith("./"), destination  # under the working directory, where pip installs from
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the checkout"
            copied.add(source)
    # What the build reads: setup.py and pyproject.toml, the readme the metadata names, the
    # packages' folders ([tool.setuptools.packages.find] where) and the project files.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    needs = {"setup.py", "pyproject.toml", pyproject["project"]["readme"], *_project_files()}
    needs |= {where.split("/")[0] for where in pyproject["tool"]["setuptools"]["packages"]["find"]["where"]}
    assert needs <= copied, f"not copied: {sorted(needs - copied)}"
    installs = [args for args in _all("RUN") if "pip install" in args]
    assert installs == ["pip install --no-cache-dir ."]
    # the install runs after the last COPY, so it sees every copied file
    order = [instruction for instruction, args in steps if instruction == "COPY" or "pip install" in args]
    assert order[-1] == "RUN"


def test_the_image_installs_bubblewrap_for_the_programs_of_a_step() -> None:
    assert any(re.search(r"apt-get install .*\bbubblewrap\b", args) for args in _all("RUN"))


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns) or any(
        fnmatch.fnmatch(part, p.removeprefix("**/")) for part in Path(path).parts for p in patterns
    )


def test_the_build_context_leaves_out_the_checkouts_environments_and_nothing_the_image_copies() -> None:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for left_out in (
        ".venv",
        ".venv-sam",
        ".git",
        ".aws-sam",
        "examples/newsroom/.laneflow",
        "layers/laneflow/laneflow/__pycache__",
    ):
        assert _ignored(left_out, patterns), left_out
    for sources, _ in copies():
        for source in sources:
            assert not _ignored(source, patterns), f"{source} is copied but left out of the context"


@pytest.mark.slow
def test_a_build_from_exactly_the_copied_files_gives_laneflow_with_the_worker_and_its_project_files(tmp_path: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    tracked = [name for name in listed.split("\0") if name and (ROOT / name).is_file()]
    context = tmp_path / "image"
    for sources, _ in copies():
        for source in sources:
            for name in tracked:
                if name == source or name.startswith(source.rstrip("/") + "/"):
                    (context / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / name, context / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(context)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("laneflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "laneflow/entrypoints/sandbox_worker.py",
        "laneflow/entrypoints/step_worker.py",
        "laneflow/_project/template.yaml",
        "laneflow/_project/statemachines/flow.asl.json",
    ):
        assert needed in names, needed


def test_an_empty_sandbox_image_runs_the_stacks_own_repository_at_latest() -> None:
    parameter = TEMPLATE.body["Parameters"]["SandboxImage"]
    assert parameter["Default"] == ""
    assert TEMPLATE.body["Conditions"]["UsesStackSandboxImage"] == {"Fn::Equals": [{"Ref": "SandboxImage"}, ""]}
    assert STEP["Image"] == {
        "Fn::If": ["UsesStackSandboxImage", {"Fn::Sub": "${SandboxRepository.RepositoryUri}:latest"}, {"Ref": "SandboxImage"}]
    }
    repository = TEMPLATE.resources["SandboxRepository"]
    assert repository["Type"] == "AWS::ECR::Repository"
    assert repository["Properties"]["ImageTagMutability"] == "MUTABLE"  # latest is pushed again for each build
    assert repository["Properties"]["EmptyOnDelete"] is True
    rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert rules[0]["selection"]["countType"] == "imageCountMoreThan"  # old builds expire
    # The task pulls it with the execution role's managed policy (ECR read and log writes).
    role, _ = TEMPLATE.resources["SandboxTaskDefinition"]["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"]
    [policy] = TEMPLATE.resources[role]["Properties"]["ManagedPolicyArns"]
    assert policy["Fn::Sub"].endswith(":policy/service-role/AmazonECSTaskExecutionRolePolicy")
    assert TEMPLATE.body["Outputs"]["SandboxRepositoryUri"]["Value"] == {"Fn::GetAtt": ["SandboxRepository", "RepositoryUri"]}


def _readme_block(marker: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", readme, re.S)
    [block] = [b for b in blocks if marker in b]
    return block


def test_the_readme_builds_the_image_for_the_tasks_architecture_and_pushes_it_where_the_stack_looks() -> None:
    block = _readme_block("docker push")
    arch = TEMPLATE.resources["SandboxTaskDefinition"]["Properties"]["RuntimePlatform"]["CpuArchitecture"]
    [build] = [line for line in block.splitlines() if line.startswith("docker build")]
    assert f"--platform linux/{arch.lower()}" in build and f"-f {DOCKERFILE.relative_to(ROOT)}" in build
    assert build.rstrip().endswith(" .")  # the context is the checkout's root, as the COPY lines expect
    assert "OutputKey=='SandboxRepositoryUri'" in block and 'docker push "$REPO:latest"' in block
    assert '-t "$REPO:latest"' in build
    assert "aws ecr get-login-password" in block
