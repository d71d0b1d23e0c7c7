"""`pip install` of the project, not an editable checkout, gives a working `laneflow demo` and
`laneflow run` in an empty folder: the wheel carries the template, the state machine, the
handlers and the example workspace, and the installed code finds them.

The wheel is built from the checkout's files (tracked and new, none that git ignores) copied
elsewhere, so nothing a checkout leaves lying about (build/, .venv/) reaches it. It goes into
a fresh virtual environment with no dependencies of its own: a .pth file lends it this
environment's site-packages (a folder a .pth names is added as it is, its own .pth files are
not run, so this environment's editable laneflow stays out), and no registry is needed but
the build backend's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import EXAMPLES, ROOT

pytestmark = pytest.mark.slow


def _sh(
    *cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def _checkout_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from the checkout's files, listed by git")
    listed = _sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    here = tmp_path_factory.mktemp("build")
    source = here / "source"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    _sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", here / "dist", source, timeout=600)
    (built,) = (here / "dist").glob("laneflow-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed, and this one's packages lent to it."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _sh(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _sh(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel)
    site = Path(_sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    lent = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "_laneflow_test_dependencies.pth").write_text("".join(f"{p}\n" for p in lent), encoding="utf-8")
    return venv


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def _env() -> dict[str, str]:
    """The environment without anything that would point the installed laneflow at this
    checkout (LANEFLOW_HOME, PYTHONPATH) or change what it runs (its settings, a model key)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LANEFLOW_", "ANTHROPIC_")) and k != "PYTHONPATH"}


def test_the_wheel_carries_the_project_files_the_engine_reads_and_the_dev_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "laneflow/_project/template.yaml",
        "laneflow/_project/statemachines/flow.asl.json",
        "laneflow/_project/functions/run_step/app.py",
        "laneflow/_project/examples/newsroom/flows/brief.yaml",
        "laneflow/_project/examples/newsroom/agents/writer/outputs/.keep",
        "laneflow/domain/prices.json",
        "laneflow_dev/imitation/__init__.py",
    ):
        assert name in names, name
    handlers = {n.split("/")[3] for n in names if n.startswith("laneflow/_project/functions/") and n.endswith("/app.py")}
    assert handlers == {p.name for p in (ROOT / "functions").iterdir() if (p / "app.py").is_file()}
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "layers/", "devtools/"))]


def test_the_installed_code_runs_from_the_environment_and_finds_its_own_copy(fresh: Path, empty: Path) -> None:
    probe = "import laneflow, laneflow_dev; from laneflow.paths import project_root; print(laneflow.__file__); print(laneflow_dev.__file__); print(project_root())"
    lines = _sh(fresh / "bin" / "python", "-c", probe, cwd=empty, env=_env()).stdout.splitlines()
    assert all(Path(line).is_relative_to(fresh) for line in lines), lines
    assert lines[2].endswith(os.path.join("laneflow", "_project"))


def test_laneflow_demo_in_an_empty_folder_completes(fresh: Path, empty: Path) -> None:
    done = _sh(fresh / "bin" / "laneflow", "demo", "--json", cwd=empty, env=_env(), timeout=180)
    run = json.loads(done.stdout)
    assert run["status"] == "completed" and run["flow"] == "brief"
    assert all(step["status"] == "completed" for step in run["steps"])
    assert (empty / ".laneflow" / "laneflow.db").is_file()  # the store is the folder's own


def test_laneflow_run_of_a_copied_example_in_an_empty_folder_completes(fresh: Path, empty: Path) -> None:
    shutil.copytree(EXAMPLES / "newsroom", empty / "newsroom")
    done = _sh(
        fresh / "bin" / "laneflow",
        "run",
        "newsroom",
        "brief",
        "--input",
        '{"topics": ["tides", "kelp"]}',
        "--json",
        cwd=empty,
        env=_env(),
        timeout=180,
    )
    run = json.loads(done.stdout)
    assert run["status"] == "completed" and run["input"] == {"topics": ["tides", "kelp"]}
    assert [s["agent"] for s in run["steps"]] == ["researcher", "researcher", "writer", "editor", "publisher"]
    shown = _sh(fresh / "bin" / "laneflow", "show", run["id"], cwd=empty, env=_env(), timeout=60).stdout
    assert run["id"] in shown and "completed" in shown


def test_laneflow_init_and_examples_in_an_empty_folder_find_the_installed_copy(fresh: Path, empty: Path) -> None:
    listed = json.loads(_sh(fresh / "bin" / "laneflow", "examples", "--json", cwd=empty, env=_env()).stdout)
    assert {e["name"] for e in listed} >= {"newsroom", "starter"}
    assert all(Path(e["path"]).is_relative_to(fresh) for e in listed)  # the wheel's examples, not the checkout's
    _sh(fresh / "bin" / "laneflow", "examples", "copy", "scouts", cwd=empty, env=_env())
    assert (empty / "scouts" / "flows" / "survey.yaml").is_file()
    made = _sh(fresh / "bin" / "laneflow", "init", "desk", cwd=empty, env=_env()).stdout
    [fanout] = [line.strip() for line in made.splitlines() if " run desk fanout " in line]
    done = _sh(*shlex.split(fanout), "--json", cwd=empty, env=_env(), timeout=180)
    assert json.loads(done.stdout)["status"] == "completed"
