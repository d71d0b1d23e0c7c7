"""Where the project's files are found: LANEFLOW_HOME, else the copy an installed wheel
carries, else the checkout the library lives in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT

from laneflow import paths


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("LANEFLOW_HOME", raising=False)
    paths.project_root.cache_clear()
    yield
    paths.project_root.cache_clear()


def _project(folder: Path) -> Path:
    (folder / "statemachines").mkdir(parents=True)
    (folder / "template.yaml").write_text("Resources: {}\n", encoding="utf-8")
    return folder


def test_a_checkout_finds_itself_above_the_library() -> None:
    assert not paths.PACKAGED.exists()  # a checkout (or an editable install) has no packaged copy
    assert paths.project_root() == ROOT


def test_an_installed_wheel_uses_the_copy_it_carries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(paths, "PACKAGED", _project(tmp_path / "_project"))
    assert paths.project_root() == tmp_path / "_project"


def test_laneflow_home_comes_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(paths, "PACKAGED", _project(tmp_path / "_project"))
    monkeypatch.setenv("LANEFLOW_HOME", str(tmp_path / "home"))
    assert paths.project_root() == (tmp_path / "home").resolve()


def test_no_project_anywhere_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from laneflow.domain.errors import LaneflowError

    monkeypatch.setattr(paths, "PACKAGED", tmp_path / "_project")
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "site-packages" / "laneflow" / "paths.py"))
    with pytest.raises(LaneflowError, match="install laneflow with pip, run from a checkout, or set LANEFLOW_HOME"):
        paths.project_root()
