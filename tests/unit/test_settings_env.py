"""The process's environment is read in one place, laneflow/settings.py: every other module
of the library and of the functions is handed what was read (the settings, or the mapping
itself from `laneflow.settings.environ`). The one exception is a process setting itself up
as its main: the sandbox worker's fork takes the step's whole environment as its own."""

from __future__ import annotations

import ast

from helpers import ROOT

LIBRARY = ROOT / "layers" / "laneflow" / "laneflow"

FUNCTIONS = ROOT / "functions"

ENVIRONMENT = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})

# (module, function) where the environment may be touched besides settings.py.
ALLOWED = {
    ("laneflow/entrypoints/sandbox_worker.py", "_forked"),  # a fork, set up as a process of its own
}


def environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of each use of the process's environment in `source`:
    `os.environ` and its kin, whether imported as `os`, under another name, or by name."""
    tree = ast.parse(source)
    os_names = {"os"}
    direct: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            direct |= {a.asname or a.name for a in node.names if a.name in ENVIRONMENT}
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inside = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if (
                isinstance(child, ast.Attribute)
                and child.attr in ENVIRONMENT
                and isinstance(child.value, ast.Name)
                and child.value.id in os_names
            ) or (isinstance(child, ast.Name) and child.id in direct):
                found.append((child.lineno, where))
            visit(child, inside)

    visit(tree, "<module>")
    return found


def test_the_finder_sees_every_form_of_an_environment_read() -> None:
    source = (
        "import os\nimport os as system\nfrom os import getenv as ge\n"
        "A = os.environ.get('A')\n"
        "def f():\n    return system.getenv('B')\n"
        "def g():\n    return ge('C')\n"
        "def h():\n    return os.path.join('no', 'read')\n"
    )
    assert environment_reads(source) == [(4, "<module>"), (6, "f"), (8, "g")]


def test_only_settings_reads_the_environment() -> None:
    files = [p for p in LIBRARY.rglob("*.py") if p.name != "settings.py" or p.parent != LIBRARY]
    files += list(FUNCTIONS.rglob("*.py"))
    assert len(files) > 50  # the library and the functions, not an empty folder
    reads = [
        f"{name}:{line} in {where}"
        for path in files
        for name in [str(path.relative_to(LIBRARY.parent if path.is_relative_to(LIBRARY) else ROOT))]
        for line, where in environment_reads(path.read_text(encoding="utf-8"))
        if (name, where) not in ALLOWED
    ]
    assert reads == [], "read the environment in laneflow/settings.py (a Settings field, or `environ()`)"
