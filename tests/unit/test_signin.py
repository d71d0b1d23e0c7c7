"""Where the viewer signs people in: the people API's stage variables, else this process's
settings (LANEFLOW_SIGNIN_DOMAIN and LANEFLOW_SIGNIN_CLIENT_ID), else nowhere; the page then
carries the hosted UI's origin and app client, and its policy lets it call that origin and no
other. A domain or client id that cannot be one is refused naming its variable."""

from __future__ import annotations

import re

import pytest

from laneflow.domain.errors import InvalidInput
from laneflow.entrypoints.api import viewer_assets
from laneflow.entrypoints.api.viewer_assets import SignIn
from laneflow.settings import Settings, signin_origin

HOSTED = "https://acme.auth.eu-west-1.amazoncognito.com"
STAGE = {"stageVariables": {"signinDomain": "acme.auth.eu-west-1.amazoncognito.com", "signinClientId": "4abc5def"}}


def _connect_src(policy: str) -> str:
    found = re.search(r"connect-src ([^;]+);", policy)
    assert found, policy
    return str(found[1])


def test_a_page_that_signs_people_in_carries_its_hosted_ui_and_may_call_that_origin_besides_its_own() -> None:
    page, policy = viewer_assets.page("/v1", SignIn(HOSTED, "4abc5def"))
    assert f'data-signin-url="{HOSTED}"' in page and 'data-signin-client="4abc5def"' in page
    assert _connect_src(policy) == f"'self' {HOSTED}"
    assert "form-action 'none'" in policy and "unsafe-inline" not in policy


def test_a_page_that_signs_no_one_in_has_no_hosted_ui_and_calls_only_its_own_origin() -> None:
    page, policy = viewer_assets.page("")
    assert 'data-signin-url=""' in page and 'data-signin-client=""' in page
    assert _connect_src(policy) == "'self'"


def test_the_sign_in_is_the_stages_else_the_settings_else_none() -> None:
    local = Settings(signin_domain="http://127.0.0.1:4567", signin_client_id="local1")
    assert viewer_assets.sign_in(STAGE, local) == SignIn(HOSTED, "4abc5def")
    assert viewer_assets.sign_in({"stageVariables": None}, local) == SignIn("http://127.0.0.1:4567", "local1")
    assert viewer_assets.sign_in({"stageVariables": {"signinDomain": "a.example"}}, Settings()) is None
    assert viewer_assets.sign_in({}, Settings()) is None


def test_a_stage_variable_that_is_no_hosted_ui_is_refused_not_put_in_the_page() -> None:
    with pytest.raises(ValueError, match="is https"):
        viewer_assets.sign_in({"stageVariables": {"signinDomain": "http://evil.example", "signinClientId": "a1"}}, Settings())
    with pytest.raises(ValueError, match="letters and digits"):
        viewer_assets.sign_in(
            {"stageVariables": {"signinDomain": "auth.example.com", "signinClientId": 'a" onload="x'}}, Settings()
        )


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("acme.auth.eu-west-1.amazoncognito.com", HOSTED),
        ("Auth.Example.com/", "https://auth.example.com"),
        ("https://auth.example.com:8443", "https://auth.example.com:8443"),
        ("http://127.0.0.1:4567", "http://127.0.0.1:4567"),
        ("http://localhost:80/", "http://localhost:80"),
    ],
)
def test_a_hosted_ui_domain_is_read_as_its_origin(given: str, origin: str) -> None:
    assert signin_origin(given) == origin


@pytest.mark.parametrize(
    "given",
    [
        "http://auth.example.com",
        "https://auth.example.com/login",
        "https://u@auth.example.com",
        "ftp://a.example",
        "a b",
        "https://a.example:x",
    ],
)
def test_what_is_no_hosted_ui_domain_is_refused(given: str) -> None:
    with pytest.raises(ValueError):
        signin_origin(given)


def test_the_sign_in_settings_are_read_from_the_environment_together_and_checked_by_name() -> None:
    read = Settings.from_env({"LANEFLOW_SIGNIN_DOMAIN": "auth.example.com", "LANEFLOW_SIGNIN_CLIENT_ID": "abc123"})
    assert (read.signin_domain, read.signin_client_id) == ("https://auth.example.com", "abc123")
    assert read.to_env()["LANEFLOW_SIGNIN_DOMAIN"] == "https://auth.example.com"
    with pytest.raises(InvalidInput, match="LANEFLOW_SIGNIN_DOMAIN and LANEFLOW_SIGNIN_CLIENT_ID are given together"):
        Settings.from_env({"LANEFLOW_SIGNIN_DOMAIN": "auth.example.com"})
    with pytest.raises(InvalidInput, match="^LANEFLOW_SIGNIN_DOMAIN: .*is https"):
        Settings.from_env({"LANEFLOW_SIGNIN_DOMAIN": "http://auth.example.com", "LANEFLOW_SIGNIN_CLIENT_ID": "abc123"})
    with pytest.raises(InvalidInput, match="^LANEFLOW_SIGNIN_CLIENT_ID: .*letters and digits"):
        Settings.from_env({"LANEFLOW_SIGNIN_DOMAIN": "auth.example.com", "LANEFLOW_SIGNIN_CLIENT_ID": "abc/123"})
    assert Settings.from_env({}).signin_domain is None
