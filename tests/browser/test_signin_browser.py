"""A person signs in to the viewer the way the people API's viewer signs them in: in headless
Chromium, against a real `laneflow serve` told to sign people in at a local imitation of the
Cognito hosted UI (laneflow_dev.hosted_ui), with the authorization code grant and PKCE. What
the viewer sent and what it was answered are read from the imitation; screenshots of the
flow are kept in build/test-artefacts/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import FIXTURES, ROOT
from playwright.sync_api import expect

from laneflow_dev import browser as harness
from laneflow_dev.hosted_ui import HostedUi, s256

pytestmark = pytest.mark.slow

CLIENT = "viewerclient1"
ARTEFACTS = ROOT / "build" / "test-artefacts"
REFUSAL = "this request carries no identity to take a tenant from"


@pytest.fixture
def hosted() -> Iterator[HostedUi]:
    with HostedUi(client_id=CLIENT) as ui:
        yield ui


@pytest.fixture
def signed(chromium: Any, hosted: HostedUi) -> Iterator[harness.Served]:
    """`laneflow serve` whose viewer signs people in at `hosted` (registered as its app
    client's callback and sign-out URL, as the stack registers the PeopleUrl)."""
    with harness.served({"ws_gate": FIXTURES / "ws_gate"}, signin_domain=hosted.url, signin_client_id=CLIENT) as running:
        hosted.callbacks = hosted.logout_urls = [running.url + "/"]
        yield running


@pytest.fixture
def person(chromium: Any, signed: harness.Served) -> Iterator[Any]:
    """A page that keeps, for each call to the API, its URL and its Authorization header."""
    context = chromium.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.calls, page.errors = [], []
    api = signed.url + "/runs"
    page.on("request", lambda r: r.url.startswith(api) and page.calls.append((r.url, r.headers.get("authorization"))))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.set_default_timeout(20000)
    yield page
    context.close()


def at_the_hosted_ui(page: Any, hosted: HostedUi) -> None:
    expect(page).to_have_url(re.compile("^" + re.escape(hosted.url + "/oauth2/authorize?")))
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()


def sign_in(page: Any, hosted: HostedUi) -> None:
    at_the_hosted_ui(page, hosted)
    page.get_by_role("button", name="Sign in").click()


def shot(page: Any, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / f"signin-{name}.png"))


def test_a_person_signs_in_at_the_hosted_ui_with_pkce_and_the_api_gets_their_id_token(
    person: Any, signed: harness.Served, hosted: HostedUi
) -> None:
    # Given a run, and a person who opens its page without a session,
    run_id = signed.start("ws_gate", "lone")
    signed.wait(run_id, "completed")
    person.goto(f"{signed.url}/#/runs/{run_id}")

    # Then they are sent to the hosted UI with an S256 challenge, a state and the viewer's URL.
    at_the_hosted_ui(person, hosted)
    [asked] = hosted.authorizations
    assert asked["response_type"] == "code" and asked["client_id"] == CLIENT
    assert asked["redirect_uri"] == signed.url + "/" and asked["scope"] == "openid email"
    assert asked["code_challenge_method"] == "S256" and len(asked["state"]) >= 16
    assert person.calls == []  # nothing asked of the API before a token
    shot(person, "hosted-ui")

    # When they sign in there,
    person.get_by_role("button", name="Sign in").click()

    # Then they are back where they were, signed in, with the code gone from the URL,
    expect(person.locator(f'.run[data-run="{run_id}"]')).to_be_visible()
    expect(person.locator('[data-k="signed-in"]')).to_have_text("Signed in as alice@example.com · tenant harbour")
    assert person.url == f"{signed.url}/#/runs/{run_id}"
    # the code was redeemed with the verifier whose S256 challenge the redirect carried,
    [exchange] = hosted.exchanges
    assert exchange["grant_type"] == "authorization_code" and exchange["client_id"] == CLIENT
    assert exchange["redirect_uri"] == signed.url + "/" and exchange["code"]
    assert len(exchange["code_verifier"]) >= 43 and s256(exchange["code_verifier"]) == asked["code_challenge"]
    # and every call to the API carries the ID token, kept in this tab's sessionStorage only.
    [token] = hosted.issued
    expect(person.locator('[data-k="live"]')).to_have_text("polling")  # no stream: it cannot carry the token
    assert person.calls and all(auth == token for _, auth in person.calls), person.calls
    stored = person.evaluate("[sessionStorage.getItem('laneflow-id-token'), localStorage.length]")
    assert stored == [token, 0]
    shot(person, "signed-in")
    person.set_viewport_size({"width": 390, "height": 844})  # a phone: who and the way out still fit
    assert person.evaluate("document.querySelector('.session').scrollWidth") <= 390
    expect(person.get_by_role("button", name="Sign out")).to_be_in_viewport()
    assert not person.errors


def test_an_answer_with_another_state_is_refused_with_a_message_and_its_code_is_never_redeemed(
    person: Any, signed: harness.Served, hosted: HostedUi
) -> None:
    # Given a hosted UI answer that carries a state this tab did not send,
    hosted.forged_state = "forged-state-of-another-tab"
    person.goto(signed.url + "/")
    sign_in(person, hosted)

    # Then the viewer refuses it, says so, and neither redeems the code nor calls the API.
    refused = person.locator('[data-k="signin-refused"]')
    expect(refused).to_contain_text("state is not the one this tab sent")
    assert hosted.exchanges == [] and person.calls == []
    assert "code=" not in person.url and "state=" not in person.url
    assert person.evaluate("sessionStorage.getItem('laneflow-id-token')") is None
    shot(person, "refused")

    # When the person signs in again with an honest answer, it is taken.
    hosted.forged_state = None
    refused.get_by_role("button", name="Sign in again").click()
    sign_in(person, hosted)
    expect(person.locator('[data-k="signed-in"]')).to_be_visible()
    expect(person.locator(".empty, tr.run-row").first).to_be_visible()
    assert len(hosted.exchanges) == 1 and person.calls and person.calls[-1][1] == hosted.issued[0]


def test_sign_out_goes_to_the_hosted_uis_logout_and_the_viewer_then_asks_for_a_new_sign_in(
    person: Any, signed: harness.Served, hosted: HostedUi
) -> None:
    person.goto(signed.url + "/")
    sign_in(person, hosted)
    expect(person.locator('[data-k="signed-in"]')).to_be_visible()

    person.get_by_role("button", name="Sign out").click()

    # The hosted UI's /logout, back to the viewer, which has no token left: a new sign-in.
    at_the_hosted_ui(person, hosted)
    assert hosted.logouts == [{"client_id": CLIENT, "logout_uri": signed.url + "/"}]
    first, second = hosted.authorizations
    assert second["state"] != first["state"] and second["code_challenge"] != first["code_challenge"]
    sign_in(person, hosted)
    expect(person.locator('[data-k="signed-in"]')).to_be_visible()
    assert len(hosted.issued) == 2
    expect(person.locator(".empty, tr.run-row").first).to_be_visible()
    assert person.calls[-1][1] == hosted.issued[1]


def test_a_token_that_ends_or_that_the_api_refuses_signs_the_person_in_again(
    person: Any, signed: harness.Served, hosted: HostedUi
) -> None:
    # Given a token good for about 3 s (the viewer takes one within 30 s of its end as ended),
    hosted.token_ttl_s = 33
    person.goto(signed.url + "/")
    sign_in(person, hosted)
    expect(person.locator('[data-k="signed-in"]')).to_be_visible()
    # Then, once it has ended, the list's next call sends the person to sign in again.
    hosted.token_ttl_s = 3600
    sign_in(person, hosted)
    expect(person.locator('[data-k="signed-in"]')).to_be_visible()
    expect(person.locator(".empty, tr.run-row").first).to_be_visible()  # the API took the new token
    assert len(hosted.issued) == 2

    # When the API refuses the token once (its authorizer's 401: revoked, or ended early),
    refused_once: list[str] = []

    def refuse_once(route: Any) -> None:
        if refused_once:
            route.fallback()
        else:
            refused_once.append(route.request.url)
            route.fulfill(status=401, json={"message": "Unauthorized"})

    person.route(lambda url: url.startswith(signed.url + "/runs?"), refuse_once)
    # Then the person is sent to sign in again, and the calls after carry the new token.
    sign_in(person, hosted)
    expect(person.locator(".empty, tr.run-row").first).to_be_visible()
    assert refused_once and len(hosted.issued) == 3
    person.wait_for_timeout(2500)  # a poll of the list or two
    assert person.calls[-1][1] == hosted.issued[2]


def test_a_fresh_token_the_api_refuses_is_not_sent_round_again_and_the_page_says_why(
    person: Any, signed: harness.Served, hosted: HostedUi
) -> None:
    # Given an account the API refuses every time (a token without a tenant claim),
    person.route(
        lambda url: url.startswith(signed.url + "/runs?"), lambda route: route.fulfill(status=401, json={"message": REFUSAL})
    )
    person.goto(signed.url + "/")
    sign_in(person, hosted)

    # Then the viewer says why, offers a new sign-in or a sign-out, and stays put.
    card = person.locator('[data-k="signin"]')
    expect(card).to_contain_text(REFUSAL)
    expect(card.get_by_role("button", name="Sign in again")).to_be_visible()
    expect(card.get_by_role("button", name="Sign out")).to_be_visible()
    shot(person, "api-refused")
    person.wait_for_timeout(4500)  # two polls of the list
    assert len(hosted.authorizations) == 1 and person.url.startswith(signed.url)
    assert len(person.calls) >= 2 and all(auth == hosted.issued[0] for _, auth in person.calls)


def test_without_a_sign_in_the_viewer_asks_no_one_and_sends_no_authorization(page: Any, served: harness.Served) -> None:
    calls: list[str | None] = []

    def keep(request: Any) -> None:
        if request.url.startswith(served.url + "/runs"):
            calls.append(request.headers.get("authorization"))

    page.on("request", keep)
    page.goto(served.url + "/")
    expect(page.locator(".empty, tr.run-row").first).to_be_visible()
    assert page.url == served.url + "/"
    expect(page.locator(".session")).to_have_count(0)
    assert calls and calls == [None] * len(calls)
