"""The rules docs/ARCHITECTURE.md states about the tree, each checked here or by a gate
`make lint` runs (named beside the rule there).

- The import contracts (pyproject's [tool.importlinter]) hold, and each one breaks when a
  violation of it is planted in a copy of the library: a contract that cannot fail is not a rule.
- No module is over 600 lines, in the library, the dev tools, the handlers, the benchmarks,
  the scripts or the tests.
"""

from __future__ import annotations

import importlib
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
    bases = [ROOT, LIBRARY, ROOT / "devtools" / "laneflow_dev", ROOT / "tests"]
    bases += [path for path in LIBRARY.iterdir() if path.is_dir() and path.name != "__pycache__"]
    bases += [path for path in (LIBRARY / "adapters").iterdir() if path.is_dir() and path.name != "__pycache__"]
    return any((base / named.rstrip("/")).exists() for base in bases)


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
    modules = set(NAMED_MODULE.findall(text))
    assert len(paths) > 40 and modules  # it does describe the tree
    assert sorted(p for p in paths if not _path_exists(p)) == []
    assert sorted(m for m in modules if not _module_exists(m)) == []
