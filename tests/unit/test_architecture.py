"""The rules docs/ARCHITECTURE.md states about the tree, each checked here or by a gate
`make lint` runs (named beside the rule there).

- The import contracts (pyproject's [tool.importlinter]) hold, and each one breaks when a
  violation of it is planted in a copy of the library: a contract that cannot fail is not a rule.
- No module is over 600 lines, in the library, the dev tools, the handlers, the benchmarks,
  the scripts or the tests.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

LIBRARY = ROOT / "layers" / "laneflow" / "laneflow"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_LINES = 600

# (the contract's name as pyproject gives it, the module a violation is planted in, the import)
PLANTED = {
    "layers": ("Layers: each may import only the layers below it", "domain/records.py", "import laneflow.usecases.stop"),
    "use-case-reaches-adapter": (
        "Layers: each may import only the layers below it",
        "usecases/stop.py",
        "import laneflow.adapters.store.sqlite",
    ),
    "cloud-library-in-domain": (
        "The domain, the ports and the use cases use no AWS, model or engine library",
        "usecases/approve.py",
        "import boto3",
    ),
    "settings-reach-up": (
        "Settings and paths sit beside the layers: they import only the domain",
        "settings.py",
        "import laneflow.ports",
    ),
    "dev-tools-shipped": (
        "The shipped library never imports the dev tools (the CLI's demo may)",
        "adapters/workers.py",
        "import laneflow_dev.imitation",
    ),
}


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{root / 'layers' / 'laneflow'}:{root / 'devtools'}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_import_contracts_hold_on_the_tree() -> None:
    done = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_violation_planted_in_a_copy_breaks_its_contract(tmp_path: Path, case: Any) -> None:
    contract, module, statement = PLANTED[case]
    copy = tmp_path / "project"
    shutil.copytree(LIBRARY, copy / "layers" / "laneflow" / "laneflow", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "devtools" / "laneflow_dev", copy / "devtools" / "laneflow_dev", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    planted = copy / "layers" / "laneflow" / "laneflow" / module
    source = planted.read_text()
    assert statement not in source
    planted.write_text(f"{source}\n{statement}  # planted\n")
    done = lint_imports(copy, copy / "pyproject.toml")
    assert done.returncode != 0, done.stdout[-3000:]
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), done.stdout[-3000:]


def test_no_module_is_over_600_lines() -> None:
    roots = [LIBRARY, ROOT / "devtools", ROOT / "functions", ROOT / "bench", ROOT / "scripts", ROOT / "tests"]
    long = {
        str(path.relative_to(ROOT)): n
        for base in roots
        for path in sorted(base.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines: {long}"


def test_the_project_speaks_of_itself_not_of_the_history_of_its_work() -> None:
    history = re.compile(r"\b(session|issue|item|stop) #?[0-9]", re.I)
    roots = ["docs", "bench", "layers", "functions", "tests", "devtools", "scripts", "README.md"]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for root in roots
        for path in sorted((ROOT / root).rglob("*") if (ROOT / root).is_dir() else [ROOT / root])
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".json", ".js", ".txt", ".toml", ".html", ".css"}
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if history.search(line)
    ]
    assert found == []


# A file or folder the architecture names, in backticks: `adapters/store/sqlite.py`, `tests/contract/`.
NAMED_PATH = re.compile(r"`([\w./-]+(?:\.(?:py|md|json|yaml|sh|js|toml|css|html)|/))`")
# A module or a name in one: `laneflow.wiring.services`, `adapters.store.dynamodb`, `domain.prompt`.
NAMED_MODULE = re.compile(r"`((?:laneflow|laneflow_dev|domain|ports|usecases|adapters|entrypoints|wiring)(?:\.\w+)+)`")


def _path_exists(named: str) -> bool:
    """Named from the project's root, or by its end within it (`adapters/store/sqlite.py`,
    `run_step/`, `handler.py` in the imitation)."""
    if (ROOT / named.rstrip("/")).exists():
        return True
    tail = named.rstrip("/")
    trees = [LIBRARY, ROOT / "devtools", ROOT / "tests", ROOT / "functions", ROOT / "scripts", ROOT / "bench"]
    return any(
        str(path).endswith(f"/{tail}")
        for tree in trees
        for path in tree.rglob(Path(tail).name)
        if "__pycache__" not in path.parts
    )


def _module_exists(dotted: str) -> bool:
    if not dotted.startswith(("laneflow.", "laneflow_dev.")):
        dotted = f"laneflow.{dotted}"
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_file_and_module_the_architecture_names_is_in_the_tree() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paths = set(NAMED_PATH.findall(text))
    modules = {name for name in NAMED_MODULE.findall(text) if not NAMED_PATH.fullmatch(f"`{name}`")}
    assert len(paths) > 40 and modules  # it does describe the tree
    assert sorted(p for p in paths if not _path_exists(p)) == []
    assert sorted(m for m in modules if not _module_exists(m)) == []


def _adapter_classes_called(path: Path) -> list[str]:
    """The adapter classes a module imports and calls: `FolderWorkspaces(...)`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("laneflow.adapters"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if inspect.isclass(getattr(module, alias.name, None)):
                    classes[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}: {classes[node.func.id]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes
    )


def test_only_the_wiring_builds_adapters_no_entrypoint_or_handler_constructs_one() -> None:
    modules = sorted((LIBRARY / "entrypoints").rglob("*.py")) + sorted((ROOT / "functions").rglob("app.py"))
    assert len(modules) > 20
    built = [line for path in modules for line in _adapter_classes_called(path)]
    assert built == [], "build these in laneflow.wiring: " + "; ".join(built)


def test_the_check_sees_an_adapter_built_outside_the_wiring(tmp_path: Path) -> None:
    planted = tmp_path / "entry.py"
    planted.write_text("from laneflow.adapters.workers import Liveness\n\nLIVE = Liveness()\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "ROOT", tmp_path)
        assert _adapter_classes_called(planted) == ["entry.py:3: laneflow.adapters.workers.Liveness"]


# What would make a domain module do I/O beyond reading files: a connection, a process, a
# database, a signal handler, or a hook on the process's logging.
DOMAIN_FORBIDDEN = (
    "socket",
    "subprocess",
    "sqlite3",
    "http",
    "urllib.request",
    "asyncio",
    "multiprocessing",
    "signal",
    "logging",
)


def test_the_domain_opens_no_connection_starts_no_process_and_installs_no_hook() -> None:
    found = []
    for path in sorted((LIBRARY / "domain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [
                f"{path.name}: {name}" for name in names if any(name == f or name.startswith(f"{f}.") for f in DOMAIN_FORBIDDEN)
            ]
    assert found == []


def test_every_python_file_and_module_the_other_docs_name_is_in_the_tree() -> None:
    for doc in ("README.md", "docs/CHOICES.md", "docs/INPUTS.md", "bench/RESULTS.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        files = {p for p in NAMED_PATH.findall(text) if p.endswith(".py")}
        modules = {name for name in NAMED_MODULE.findall(text) if not NAMED_PATH.fullmatch(f"`{name}`")}
        assert sorted(p for p in files if not _path_exists(p)) == [], doc
        assert sorted(m for m in modules if not _module_exists(m)) == [], doc
