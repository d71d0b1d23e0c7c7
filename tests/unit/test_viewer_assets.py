"""The viewer's page, script and style are files of the package, served as one page whose
policy allows exactly that script and that style."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from laneflow.entrypoints.api import routes

VIEWER = resources.files("laneflow.entrypoints.api") / "viewer"


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_page_inlines_the_script_and_style_files_and_its_policy_allows_exactly_them():
    page, policy = routes.VIEWER_PAGE, routes.VIEWER_POLICY
    [style] = re.findall(r"<style>(.*?)</style>", page, re.S)
    [script] = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert style.strip() == (VIEWER / "viewer.css").read_text(encoding="utf-8").strip()
    assert script.strip() == (VIEWER / "viewer.js").read_text(encoding="utf-8").strip()
    assert f"script-src {_hash(script)};" in policy and f"style-src {_hash(style)};" in policy
    assert "{style}" not in page and "{script}" not in page
