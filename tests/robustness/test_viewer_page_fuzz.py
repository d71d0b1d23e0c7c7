"""The viewer's page is built from the request's stage and path (viewer_assets.base_of):
whatever an event carries there, the base is "" or "/STAGE" taken from the path itself, and
the page stays one document whose import map parses and whose policy allows exactly it."""

from __future__ import annotations

import base64
import hashlib
import json
import re

from hypothesis import given
from hypothesis import strategies as st

from laneflow.entrypoints.api import viewer_assets

ANY = st.none() | st.integers() | st.text(max_size=40) | st.lists(st.text(max_size=5), max_size=2)


@given(stage=ANY, path=ANY, extra=st.text(max_size=20))
def test_any_stage_and_path_give_a_base_from_the_path_and_a_page_whose_policy_allows_its_import_map(
    stage: int | str | list[str] | None, path: int | str | list[str] | None, extra: str
) -> None:
    if isinstance(stage, str) and isinstance(path, str) and extra:
        path = path if path.startswith(f"/{stage}") else f"/{stage}/{extra}"
    base = viewer_assets.base_of({"requestContext": {"stage": stage, "path": path}})
    assert base == "" or (isinstance(stage, str) and base == f"/{stage}" and str(path).startswith(base))

    page, policy = viewer_assets.page(base)
    [importmap] = re.findall(r'<script type="importmap">(.*?)</script>', page, re.S)
    assert set(json.loads(importmap)["imports"]) == set(viewer_assets.IMPORTS)
    digest = base64.b64encode(hashlib.sha256(importmap.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy
    assert page.count("<script") == 2 and page.lower().count("</script") == 2  # a stage cannot open or close a tag
