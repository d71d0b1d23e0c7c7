"""The build's one step beyond pyproject.toml: the project files the local engine reads when it
runs (template.yaml's wiring, the state machine definition, the handlers it imports by path)
and the example workspace `laneflow demo` runs travel in the wheel, under
`laneflow/_project/`, where `laneflow.paths.project_root()` finds them. A checkout (and an
editable install) reads them in place; the Lambda layer copies the library's folder, which
never holds this copy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent

# Mirrors laneflow.paths.PACKAGED (the folder) and what project_root() must find there.
PACKAGED = Path("laneflow", "_project")

PROJECT_FILES = ("template.yaml", "statemachines", "functions", "examples")

LEFT_OUT = {"__pycache__", ".laneflow"}  # caches, and a store a run may leave beside an example


def project_files() -> Iterator[tuple[Path, Path]]:
    """Each file that travels: its path in the checkout and its path inside the package copy."""
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_file():
            yield source, Path(name)
            continue
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and not LEFT_OUT & set(rel.parts) and path.suffix != ".pyc":
                yield path, rel


class BuildPyWithProject(build_py):
    """`build_py`, then the project files copied into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout itself
            return
        target = Path(self.build_lib) / PACKAGED
        shutil.rmtree(target, ignore_errors=True)  # nothing left from an earlier build
        for source, rel in project_files():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)  # keeps the mode: an example's scripts stay executable

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [str(Path(self.build_lib) / PACKAGED / rel) for _, rel in project_files()]


setup(cmdclass={"build_py": BuildPyWithProject})
