"""The workspace reader's two path helpers, rewritten to be cheap (a step reads a dozen paths):
they answer exactly what the pathlib versions they replace answered."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.domain.workspace_files import rel_path as _rel
from laneflow.domain.workspace_files import visible_files as _files

NAME = st.text(alphabet=string.ascii_letters + string.digits + "._- ", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..")
)


def rel_by_pathlib(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def files_by_pathlib(folder: Path, pattern: str) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith("."))


@given(root=st.lists(NAME, min_size=1, max_size=4), tail=st.lists(NAME, min_size=1, max_size=4), absolute=st.booleans())
def test_a_path_under_the_root_and_one_outside_it_are_named_as_relpath_names_them(
    root: list[str], tail: list[str], absolute: bool
) -> None:
    base = Path("/" if absolute else ".", *root)
    assert _rel(base.joinpath(*tail), base) == rel_by_pathlib(base.joinpath(*tail), base)
    outside = Path("/" if absolute else ".", *tail, "AGENTS.md")  # an account's AGENTS.md, beside the workspace
    assert _rel(outside, base) == rel_by_pathlib(outside, base)
    assert _rel(base.parent / "AGENTS.md", base) == rel_by_pathlib(base.parent / "AGENTS.md", base)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(NAME, st.sampled_from(["file", "dir", "link-to-file", "link-to-dir", "dangling"])),
        max_size=10,
        unique_by=lambda e: e[0],
    ),
    pattern=st.sampled_from(["*", "*.md", "*.yaml", "*.yml", "a*", "*.MD"]),
)
def test_a_folder_s_visible_files_are_the_ones_glob_and_is_file_gave(
    tmp_path_factory: pytest.TempPathFactory, entries: list[tuple[str, str]], pattern: str
) -> None:
    folder = tmp_path_factory.mktemp("listing")
    target_file = folder.parent / f"{folder.name}-target.txt"
    target_file.write_text("x")
    for name, kind in entries:
        path = folder / name
        if kind == "file":
            path.write_text("x")
        elif kind == "dir":
            path.mkdir()
        elif kind == "link-to-file":
            path.symlink_to(target_file)
        elif kind == "link-to-dir":
            path.symlink_to(folder.parent)
        else:
            path.symlink_to(folder / "nowhere")
    assert _files(folder, pattern) == files_by_pathlib(folder, pattern)


def test_a_missing_folder_or_a_file_in_its_place_has_no_files(tmp_path: Path) -> None:
    assert _files(tmp_path / "missing") == [] == files_by_pathlib(tmp_path / "missing", "*")
    (tmp_path / "plain").write_text("x")
    assert _files(tmp_path / "plain") == [] == files_by_pathlib(tmp_path / "plain", "*")
