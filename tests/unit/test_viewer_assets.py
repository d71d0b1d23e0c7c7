"""The viewer's files are files of the package: every one is served at /assets/NAME with its
type, the vendored libraries are the ones VENDORED.md names (by sha256), nothing in them is
loaded from elsewhere, and the page's policy allows this origin's scripts plus exactly its
one inline import map."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from importlib import resources

from laneflow.entrypoints.api import viewer_assets

VIEWER = resources.files("laneflow.entrypoints.api") / "viewer"


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_every_module_style_and_vendored_library_is_served_with_its_type() -> None:
    assert {"app.js", "model.js", "viewer.css", "preact.mjs", "preact-hooks.mjs", "htm.mjs"} <= set(viewer_assets.ASSETS)
    assert viewer_assets.asset("app.js").content_type.startswith("text/javascript")
    assert viewer_assets.asset("viewer.css").content_type.startswith("text/css")
    assert viewer_assets.asset("preact.mjs").text == (VIEWER / "vendor" / "preact.mjs").read_text(encoding="utf-8")
    assert "index.html" not in viewer_assets.ASSETS and "VENDORED.md" not in viewer_assets.ASSETS
    assert viewer_assets.asset("favicon.svg").content_type == "image/svg+xml"


def test_every_module_a_module_imports_is_served_and_the_page_names_its_favicon() -> None:
    modules = {name: found.text for name, found in viewer_assets.ASSETS.items() if name.endswith(".js")}
    assert {"app.js", "api.js", "list.js", "run.js", "history.js", "dialog.js"} <= set(modules)
    for name, text in modules.items():
        for imported in re.findall(r"""from\s*["']\./([^"']+)["']""", text):
            assert imported in viewer_assets.ASSETS, f"{name} imports ./{imported}, which is not served"
    page, _ = viewer_assets.page("/v1")
    assert '<link rel="icon" type="image/svg+xml" href="/v1/assets/favicon.svg">' in page


def test_vendored_md_names_each_vendored_file_with_its_version_and_sha256() -> None:
    listed = (VIEWER / "vendor" / "VENDORED.md").read_text(encoding="utf-8")
    for name in viewer_assets.IMPORTS.values():
        digest = hashlib.sha256((VIEWER / "vendor" / name).read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(name)}`.*`{digest}`", listed), name
    assert (VIEWER / "vendor" / "LICENSE-preact.txt").is_file() and (VIEWER / "vendor" / "LICENSE-htm.txt").is_file()


def test_no_asset_loads_anything_from_elsewhere_or_writes_html() -> None:
    for name, found in viewer_assets.ASSETS.items():
        if name.endswith((".js", ".css")):  # our own modules and style
            assert "http://" not in found.text and "https://" not in found.text and "@import" not in found.text, name
            assert not re.search(r"innerHTML|insertAdjacentHTML|document\.write|dangerouslySetInnerHTML|\beval\(", found.text), (
                name
            )
            assert not re.search(r"""(from|import)\s*["'](?!\./|preact|htm)""", found.text), name


def test_the_page_names_its_assets_under_the_stage_and_its_policy_allows_exactly_its_import_map() -> None:
    page, policy = viewer_assets.page("/v1")
    assert 'src="/v1/assets/app.js"' in page and 'href="/v1/assets/viewer.css"' in page and 'data-base="/v1"' in page
    [importmap] = re.findall(r'<script type="importmap">(.*?)</script>', page, re.S)
    assert json.loads(importmap)["imports"]["preact"] == "/v1/assets/preact.mjs"
    assert f"script-src 'self' {_hash(importmap)};" in policy and "style-src 'self';" in policy
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy and "unsafe-eval" not in policy
    local, _ = viewer_assets.page("")
    assert 'src="/assets/app.js"' in local


def test_the_base_is_the_stage_only_when_the_request_path_carries_it() -> None:
    assert viewer_assets.base_of({"requestContext": {"stage": "v1", "path": "/v1/"}}) == "/v1"
    assert viewer_assets.base_of({"requestContext": {"stage": "v1", "path": "/v1"}}) == "/v1"
    assert viewer_assets.base_of({"requestContext": {"stage": "local", "path": "/"}}) == ""  # laneflow serve
    assert viewer_assets.base_of({"requestContext": {"stage": "v1", "path": "/v10/x"}}) == ""
    assert viewer_assets.base_of({}) == ""
