"""The run viewer's files, as the API serves them: the page at `/` and its assets at
`/assets/NAME` (its own modules and style, and the vendored Preact and htm of `viewer/vendor/`,
see `viewer/VENDORED.md`). Nothing is fetched from elsewhere: the page's policy allows
scripts, styles and calls of this origin only, plus the one inline import map (by hash).

The page names every asset by an absolute path under the API's base: `/` locally, `/STAGE`
behind API Gateway (whose request path carries the stage), so it works whether the person
opened `.../v1` or `.../v1/`.

Where the API signs people in (`sign_in`), the page carries the Cognito hosted UI's origin and
app client, and its policy lets it call that origin (the token endpoint); `viewer/signin.js`
does the rest. Without one (`laneflow serve` as it comes) the page signs no one in.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from dataclasses import dataclass
from html import escape
from importlib import resources
from typing import Any

from laneflow.domain.errors import NotFound
from laneflow.settings import Settings, check_client_id, signin_origin

_VIEWER = resources.files(__package__) / "viewer"

_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}

# The bare names the viewer's modules import, and the vendored file each one is.
IMPORTS = {"preact": "preact.mjs", "preact/hooks": "preact-hooks.mjs", "htm": "htm.mjs"}


@dataclass(frozen=True)
class Asset:
    text: str
    content_type: str


def _assets() -> dict[str, Asset]:
    """Every servable file of viewer/ and viewer/vendor/, by its file name (one flat
    namespace: an API Gateway path parameter holds no slash)."""
    found: dict[str, Asset] = {}
    for folder in (_VIEWER, _VIEWER / "vendor"):
        for entry in folder.iterdir():
            suffix = "." + entry.name.rsplit(".", 1)[-1]
            if not entry.is_file() or suffix not in _TYPES or entry.name == "index.html":
                continue
            if entry.name in found:
                raise RuntimeError(f"viewer asset {entry.name} exists twice")  # a packaging mistake, caught by the unit test
            found[entry.name] = Asset(entry.read_text(encoding="utf-8"), _TYPES[suffix])
    return found


ASSETS = _assets()

SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def asset(name: str) -> Asset:
    """One asset by its name, or NotFound (a 404)."""
    found = ASSETS.get(name)
    if found is None:
        raise NotFound(f"the viewer has no asset {name[:100]!r}")
    return found


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@dataclass(frozen=True)
class SignIn:
    """Where the viewer signs a person in: a Cognito hosted UI's origin (`https://DOMAIN`) and
    the app client (public, the code grant with PKCE) whose callback is the viewer's URL."""

    origin: str
    client_id: str


def sign_in(event: dict[str, Any], settings: Settings) -> SignIn | None:
    """The sign-in of the API this request came through: its stage's variables `signinDomain`
    and `signinClientId` (the people API's, template.yaml), else this process's settings
    (LANEFLOW_SIGNIN_DOMAIN and LANEFLOW_SIGNIN_CLIENT_ID), else None: nobody is asked to sign
    in. The IAM API's stage has no such variables, so its viewer never sends anyone there."""
    stage = event.get("stageVariables") or {}
    domain, client_id = stage.get("signinDomain"), stage.get("signinClientId")
    if domain and client_id:
        return SignIn(signin_origin(str(domain)), check_client_id(str(client_id)))
    if settings.signin_domain and settings.signin_client_id:
        return SignIn(settings.signin_domain, settings.signin_client_id)
    return None


@functools.lru_cache(maxsize=8)
def page(base: str, signin: SignIn | None = None) -> tuple[str, str]:
    """The viewer page for an API at `base` ("" or "/STAGE") that signs people in at `signin`
    (or signs no one in), and its Content-Security-Policy."""
    importmap = json.dumps({"imports": {name: f"{base}/assets/{file}" for name, file in IMPORTS.items()}}).replace("<", "\\u003c")
    html = (_VIEWER / "index.html").read_text(encoding="utf-8")
    html = html.replace("{base}", escape(base, quote=True)).replace("{importmap}", importmap)
    html = html.replace("{signin_url}", escape(signin.origin if signin else "", quote=True))
    html = html.replace("{signin_client}", escape(signin.client_id if signin else "", quote=True))
    connect = f"'self' {signin.origin}" if signin else "'self'"  # the token endpoint, called by signin.js
    policy = (
        f"default-src 'none'; script-src 'self' {_csp_hash(importmap)}; style-src 'self'; connect-src {connect}; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, policy


def base_of(event: dict[str, Any]) -> str:
    """Where the API's routes are on this request's host: "/STAGE" when the request came
    through API Gateway's stage URL (its requestContext.path starts with the stage), else ""."""
    context = event.get("requestContext") or {}
    stage, path = context.get("stage"), str(context.get("path") or "")
    if isinstance(stage, str) and stage and (path == f"/{stage}" or path.startswith(f"/{stage}/")):
        return f"/{stage}"
    return ""
