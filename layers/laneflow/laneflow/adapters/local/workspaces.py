"""Workspaces by name on this machine: the sub-folders of one folder (`laneflow serve`)."""

from __future__ import annotations

from pathlib import Path

from laneflow.adapters.aws.s3 import _valid_name
from laneflow.domain.errors import WorkspaceNotFound


class FolderWorkspaces:
    """Workspaces are the sub-folders of one folder. A machine's own folder has one tenant
    (the local one), so `tenant` does not choose among folders here."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def locate(self, tenant: str, name: str) -> str:
        if not _valid_name(name):
            raise WorkspaceNotFound(name)
        path = self.root / name
        if not path.is_dir():
            raise WorkspaceNotFound(name)
        return str(path)
