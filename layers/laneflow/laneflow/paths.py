"""Where the project's own files are: template.yaml, functions/, statemachines/, examples/."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from laneflow.domain.errors import LaneflowError
from laneflow.settings import project_home

# An installed wheel's copy of those files (setup.py puts it there). Real files in the package's
# folder, not only resources: the local engine imports the handlers by their path.
PACKAGED = Path(__file__).resolve().parent / "_project"


def _is_project(folder: Path) -> bool:
    return (folder / "template.yaml").is_file() and (folder / "statemachines").is_dir()


@lru_cache(maxsize=1)
def project_root() -> Path:
    """The folder holding template.yaml: LANEFLOW_HOME; else the copy an installed wheel carries
    (it matches the installed code); else the checkout this package lives in, found above it
    (the library lives at layers/laneflow/laneflow in the project)."""
    home = project_home()
    if home:
        return Path(home).resolve()
    if _is_project(PACKAGED):
        return PACKAGED
    here = Path(__file__).resolve()
    for parent in here.parents:
        if _is_project(parent):
            return parent
    raise LaneflowError(
        "cannot find the laneflow project (template.yaml): install laneflow with pip, run from a checkout, or set LANEFLOW_HOME"
    )
