"""Write layers/laneflow/requirements.txt, what `sam build` installs into the Lambda layer, from
pyproject.toml: the project's dependencies less `[tool.laneflow.layer] leave-out`.

    python scripts/layer_requirements.py           # write it (make layer-requirements)
    python scripts/layer_requirements.py --check   # exit 1 when the committed file differs
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PYPROJECT = ROOT / "pyproject.toml"

REQUIREMENTS = ROOT / "layers" / "laneflow" / "requirements.txt"

HEADER = (
    "# What the Lambda layer ships beside the laneflow package (sam build installs these).\n"
    "# Generated from pyproject.toml by `make layer-requirements`: edit the dependencies there.\n"
)


def _name(requirement: str) -> str:
    """A requirement's project name, normalized (PEP 503): `aws-lambda-powertools[tracer]>=3`
    -> `aws-lambda-powertools`."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"pyproject.toml: cannot read the dependency {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def render(pyproject: Path = PYPROJECT) -> str:
    """The requirements file's text. A leave-out that names no dependency is refused: a typo
    there would otherwise ship what it meant to leave out."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    dependencies: list[str] = data["project"]["dependencies"]
    leave_out = {_name(n) for n in data["tool"]["laneflow"]["layer"]["leave-out"]}
    unknown = sorted(leave_out - {_name(d) for d in dependencies})
    if unknown:
        raise ValueError(f"pyproject.toml: [tool.laneflow.layer] leave-out names no dependency: {', '.join(unknown)}")
    return HEADER + "".join(f"{d}\n" for d in dependencies if _name(d) not in leave_out)


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if REQUIREMENTS.is_file() and REQUIREMENTS.read_text(encoding="utf-8") == text:
            return 0
        print(f"{REQUIREMENTS.relative_to(ROOT)} is out of date: run `make layer-requirements`", file=sys.stderr)
        return 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    REQUIREMENTS.write_text(text, encoding="utf-8")
    print(f"wrote {REQUIREMENTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
