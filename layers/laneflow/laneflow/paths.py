"""Where the project's own files are: template.yaml, functions/, statemachines/, examples/."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from laneflow.domain.errors import LaneflowError


@lru_cache(maxsize=1)
def project_root() -> Path:
    """The folder holding template.yaml: LANEFLOW_HOME, else found above this package (the
    library lives at layers/laneflow/laneflow in the project)."""
    home = os.environ.get("LANEFLOW_HOME")
    if home:
        return Path(home).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "template.yaml").is_file() and (parent / "statemachines").is_dir():
            return parent
    raise LaneflowError(
        "cannot find the laneflow project (template.yaml): run from a checkout, or set LANEFLOW_HOME"
    )
