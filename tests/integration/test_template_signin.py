"""How people sign in to the deployed viewer, read from template.yaml itself: given a hosted UI
domain prefix the stack makes the pool's domain and the viewer's app client (public, no
secret, the code grant only, openid and email, back to the people API's viewer URL), or it
takes a domain and a client that exist; the people API's stage says where its viewer signs
in (not the function's environment: that would be a dependency cycle), and the function's
viewer reads it from there. The template's conditions and rules are evaluated here for each
way of filling the parameters, and cfn-lint passes on it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from laneflow.adapters.engine.template import Template
from laneflow.entrypoints.api import resolve
from laneflow.ports import Services

TEMPLATE = Template.load(ROOT / "template.yaml")
BODY = TEMPLATE.body
RESOURCES = TEMPLATE.resources
CLIENT = RESOURCES["PeopleViewerClient"]
DOMAIN = RESOURCES["PeopleHostedUiDomain"]
POOL = "arn:aws:cognito-idp:eu-west-1:123456789012:userpool/eu-west-1_AbC123"
PSEUDO = {"AWS::Region": "eu-west-1", "AWS::StackName": "laneflow"}
NO_VALUE = object()
CFN_LINT = Path(sys.executable).parent / "cfn-lint"


class Stack:
    """The template's intrinsic functions evaluated for one set of parameters (a resource's
    Ref is `<Name>`): enough of CloudFormation to read conditions, rules and values."""

    def __init__(self, **given: str):
        self.params = {name: str(p.get("Default", "")) for name, p in BODY["Parameters"].items()} | given

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        return self.params.get(name, PSEUDO.get(name, f"<{name}>"))

    def condition(self, name: str) -> bool:
        return bool(self.value(BODY["Conditions"][name]))

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.value(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1 and (fn := next(iter(node))) in self.FUNCTIONS:
            return self.FUNCTIONS[fn](self, node[fn])
        return {key: self.value(item) for key, item in node.items()}

    FUNCTIONS: dict[str, Callable[[Stack, Any], Any]] = {
        "Ref": lambda s, a: s.ref(a),
        "Fn::Equals": lambda s, a: s.value(a[0]) == s.value(a[1]),
        "Fn::Not": lambda s, a: not s.value(a[0]),
        "Fn::And": lambda s, a: all(s.value(x) for x in a),
        "Fn::Or": lambda s, a: any(s.value(x) for x in a),
        "Fn::Condition": lambda s, a: s.condition(a),
        "Fn::If": lambda s, a: s.value(a[1] if s.condition(a[0]) else a[2]),
        "Fn::Select": lambda s, a: s.value(a[1])[int(a[0])],
        "Fn::Split": lambda s, a: s.value(a[1]).split(a[0]),
        "Fn::Sub": lambda s, a: re.sub(r"\$\{([^}.]+)\}", lambda m: str(s.ref(m[1])), a),
    }

    def broken_rules(self) -> list[str]:
        return [
            assertion["AssertDescription"]
            for rule in BODY["Rules"].values()
            for assertion in rule["Assertions"]
            if not self.value(assertion["Assert"])
        ]


WAYS = {
    # parameters given: (a hosted UI, the stack makes the domain, the stack makes the client)
    "nothing": ({}, (False, False, False)),
    "a pool only": ({"PeopleUserPoolArn": POOL}, (False, False, False)),
    "a prefix": ({"PeopleUserPoolArn": POOL, "PeopleSignInDomainPrefix": "acme"}, (True, True, True)),
    "a prefix and a client": (
        {"PeopleUserPoolArn": POOL, "PeopleSignInDomainPrefix": "acme", "PeopleAppClientId": "4abc"},
        (True, True, False),
    ),
    "a domain": ({"PeopleUserPoolArn": POOL, "PeopleSignInDomain": "auth.example.com"}, (True, False, True)),
    "a domain and a client": (
        {"PeopleUserPoolArn": POOL, "PeopleSignInDomain": "auth.example.com", "PeopleAppClientId": "4abc"},
        (True, False, False),
    ),
}


@pytest.mark.parametrize("way", WAYS)
def test_the_stack_makes_the_domain_and_the_client_only_when_it_has_none_given(way: str) -> None:
    given, expected = WAYS[way]
    stack = Stack(**given)
    made = (
        stack.condition("HasPeopleHostedUi"),
        stack.condition("MakesPeopleSignInDomain"),
        stack.condition("MakesPeopleAppClient"),
    )
    assert made == expected
    assert stack.broken_rules() == []
    assert DOMAIN["Condition"] == "MakesPeopleSignInDomain" and CLIENT["Condition"] == "MakesPeopleAppClient"
    for output in ("PeopleSignInUrl", "PeopleViewerClientId"):
        assert BODY["Outputs"][output]["Condition"] == "HasPeopleHostedUi"


@pytest.mark.parametrize(
    ("given", "broken"),
    [
        ({"PeopleSignInDomainPrefix": "acme"}, "needs PeopleUserPoolArn"),
        ({"PeopleUserPoolArn": POOL, "PeopleSignInDomainPrefix": "acme", "PeopleSignInDomain": "auth.example.com"}, "not both"),
        ({"PeopleUserPoolArn": POOL, "PeopleAppClientId": "4abc"}, "needs the hosted UI"),
    ],
)
def test_a_half_given_sign_in_is_refused_before_anything_is_deployed(given: dict[str, str], broken: str) -> None:
    [said] = Stack(**given).broken_rules()
    assert broken in said


def test_the_viewers_client_is_a_public_code_grant_client_whose_urls_are_the_people_viewers() -> None:
    stack = Stack(**WAYS["a prefix"][0])
    props = stack.value(CLIENT["Properties"])
    assert props["GenerateSecret"] is False  # a browser keeps no secret: PKCE proves the redeemer
    assert props["AllowedOAuthFlowsUserPoolClient"] is True and props["AllowedOAuthFlows"] == ["code"]
    assert set(props["AllowedOAuthScopes"]) == {"openid", "email"} and props["SupportedIdentityProviders"] == ["COGNITO"]
    viewer = stack.value(BODY["Outputs"]["PeopleUrl"]["Value"])
    assert viewer == "https://<PeopleApi>.execute-api.eu-west-1.amazonaws.com/v1/"
    assert props["CallbackURLs"] == [viewer] and props["LogoutURLs"] == [viewer]
    assert props["UserPoolId"] == "eu-west-1_AbC123"
    assert "custom:tenant" not in props["WriteAttributes"]  # a person cannot move themselves to another tenant


def test_the_domain_is_the_prefix_on_the_given_pool_and_its_url_an_output() -> None:
    stack = Stack(**WAYS["a prefix"][0])
    assert stack.value(DOMAIN["Properties"]) == {"Domain": "acme", "UserPoolId": "eu-west-1_AbC123"}
    assert stack.value(BODY["Outputs"]["PeopleSignInUrl"]["Value"]) == "https://acme.auth.eu-west-1.amazoncognito.com"
    assert Stack(**WAYS["a domain"][0]).value(BODY["Outputs"]["PeopleSignInUrl"]["Value"]) == "https://auth.example.com"


def _stage_variables(way: str) -> Any:
    return Stack(**WAYS[way][0]).value(RESOURCES["PeopleApi"]["Properties"]["Variables"])


def test_the_people_stage_says_where_its_viewer_signs_in() -> None:
    made = {"signinDomain": "acme.auth.eu-west-1.amazoncognito.com", "signinClientId": "<PeopleViewerClient>"}
    assert _stage_variables("a prefix") == made
    assert _stage_variables("a domain and a client") == {"signinDomain": "auth.example.com", "signinClientId": "4abc"}
    assert _stage_variables("a pool only") is NO_VALUE


def _named(node: Any) -> set[str]:
    """Every name a Ref, GetAtt or Sub in `node` names."""
    if isinstance(node, list):
        return set().union(*map(_named, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    names: set[str] = set()
    for key, item in node.items():
        if key == "Ref":
            names.add(item)
        elif key == "Fn::GetAtt":
            names.add(item[0])
        elif key == "Fn::Sub" and isinstance(item, str):
            names |= {m.split(".")[0] for m in re.findall(r"\$\{([^}]+)\}", item)}
        else:
            names |= _named(item)
    return names


def test_the_function_names_no_sign_in_resource_so_the_client_the_api_and_it_make_no_cycle() -> None:
    # The client names the people API's URL, and the people API names the function: the
    # function naming the client would be a cycle CloudFormation refuses.
    assert "PeopleApi" in _named(CLIENT["Properties"]) and "ApiFunction" in _named(
        RESOURCES["PeopleApi"]["Properties"]["DefinitionBody"]
    )
    assert not {"PeopleViewerClient", "PeopleHostedUiDomain", "PeopleApi"} & _named(RESOURCES["ApiFunction"]["Properties"])
    assert not {"PeopleViewerClient", "PeopleHostedUiDomain"} & _named(BODY["Globals"])


def _viewer_event(stage_variables: dict[str, str] | None) -> dict[str, Any]:
    return {
        "resource": "/",
        "path": "/",
        "httpMethod": "GET",
        "headers": {"Host": "people.example"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": stage_variables,
        "requestContext": {
            "httpMethod": "GET",
            "path": "/v1/",
            "resourcePath": "/",
            "stage": "v1",
            "requestId": "r",
            "identity": {},
        },
        "body": None,
        "isBase64Encoded": False,
    }


def _policy(answer: dict[str, Any]) -> str:
    [policy] = answer["multiValueHeaders"]["Content-Security-Policy"]
    return str(policy)


def test_the_people_apis_viewer_signs_in_where_its_stage_says_and_the_iam_apis_viewer_does_not(svc: Services) -> None:
    people = resolve(_viewer_event(_stage_variables("a prefix") | {"signinClientId": "4abc5def"}), None, svc)
    hosted = "https://acme.auth.eu-west-1.amazoncognito.com"
    assert people["statusCode"] == 200
    assert f'data-signin-url="{hosted}"' in people["body"] and 'data-signin-client="4abc5def"' in people["body"]
    assert f"connect-src 'self' {hosted};" in _policy(people)
    machines = resolve(_viewer_event(None), None, svc)
    assert 'data-signin-url=""' in machines["body"] and "connect-src 'self';" in _policy(machines)


def test_cfn_lint_passes_on_the_template() -> None:
    linted = subprocess.run([str(CFN_LINT), "template.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert linted.returncode == 0, linted.stdout + linted.stderr
