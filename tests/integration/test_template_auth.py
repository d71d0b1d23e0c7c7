"""Who may call the deployed API, read from template.yaml itself: machines sign with IAM
(SigV4) and need no lambda:InvokeFunction of their own; people, when the stack is given a
Cognito user pool, reach the same function through a second API whose calls carry an ID
token, while the viewer's page and assets (which hold no data) load without one. Every route
the resolver answers is an event of the IAM API, and the tenant of a person is the token's
custom:tenant claim (checked through the API's own event shape)."""

from __future__ import annotations

import json
from typing import Any

from helpers import ROOT

from laneflow.adapters.engine.template import Template
from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.entrypoints.api import app, resolve
from laneflow.ports import Services

TEMPLATE = Template.load(ROOT / "template.yaml")
RESOURCES = TEMPLATE.resources
PEOPLE = RESOURCES["PeopleApi"]
BODY = PEOPLE["Properties"]["DefinitionBody"]


def test_the_machines_api_is_iam_signed_and_invokes_the_function_by_its_resource_policy() -> None:
    auth = RESOURCES["LaneflowApi"]["Properties"]["Auth"]
    assert auth["DefaultAuthorizer"] == "AWS_IAM" and auth["InvokeRole"] == "NONE"


def test_every_route_the_resolver_answers_is_an_event_of_the_machines_api(svc: Services) -> None:
    document = json.loads(resolve(people_event("GET", "/openapi.json", {}), None, svc)["body"])
    answered = {(path, method.upper()) for path, operations in document["paths"].items() for method in operations}
    events = RESOURCES["ApiFunction"]["Properties"]["Events"].values()
    deployed = {
        (e["Properties"]["Path"], e["Properties"]["Method"].upper())
        for e in events
        if e["Properties"].get("RestApiId") == {"Ref": "LaneflowApi"}
    }
    assert answered == deployed and len(answered) == len(app._static_routes + app._dynamic_routes)


def test_people_get_a_second_api_only_when_a_user_pool_is_given() -> None:
    conditions = TEMPLATE.body["Conditions"]
    assert conditions["HasPeopleSignIn"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "PeopleUserPoolArn"}, ""]}]}
    assert TEMPLATE.body["Parameters"]["PeopleUserPoolArn"]["Default"] == ""
    for name in ("PeopleApi", "PeopleApiInvokes"):
        assert RESOURCES[name]["Condition"] == "HasPeopleSignIn", name
    assert TEMPLATE.body["Outputs"]["PeopleUrl"]["Condition"] == "HasPeopleSignIn"


def test_the_people_api_takes_cognito_tokens_of_the_given_pool_everywhere_but_the_viewers_files() -> None:
    scheme = BODY["components"]["securitySchemes"]["cognito"]
    assert scheme["x-amazon-apigateway-authorizer"] == {
        "type": "cognito_user_pools",
        "providerARNs": [{"Ref": "PeopleUserPoolArn"}],
    }
    paths = BODY["paths"]
    assert paths["/{proxy+}"]["x-amazon-apigateway-any-method"]["security"] == [{"cognito": []}]
    for public in ("/", "/assets/{name}", "/openapi.json"):
        assert paths[public]["get"]["security"] == [], public
    for operations in paths.values():
        for operation in operations.values():
            integration = operation["x-amazon-apigateway-integration"]
            assert integration["type"] == "aws_proxy" and "${ApiFunction.Arn}" in integration["uri"]["Fn::Sub"]
    permission = RESOURCES["PeopleApiInvokes"]["Properties"]
    assert permission["Principal"] == "apigateway.amazonaws.com" and permission["FunctionName"] == {"Ref": "ApiFunction"}
    assert "${PeopleApi}/*" in permission["SourceArn"]["Fn::Sub"]


def people_event(method: str, path: str, claims: dict[str, str], body: object = None) -> dict[str, Any]:
    """What the people API delivers: its greedy proxy resource, a Cognito authorizer's claims,
    no IAM identity."""
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json", "Host": "people.example"},
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "httpMethod": method,
            "path": "/v1" + path,
            "resourcePath": "/{proxy+}",
            "stage": "v1",
            "requestId": "r",
            "identity": {"accountId": None, "sourceIp": "198.51.100.9"},
            "authorizer": {"claims": claims},
        },
        "body": json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }


class NoDrives:
    def start(self, tenant: str, run_id: str) -> str:
        return "drive"


def test_a_persons_tenant_is_their_tokens_claim_and_a_token_without_one_is_a_401(svc: Services) -> None:
    from helpers import FIXTURES

    svc.workspaces, svc.drives = FolderWorkspaces(FIXTURES), NoDrives()
    out = resolve(
        people_event(
            "POST", "/runs", {"sub": "u-1", "custom:tenant": "harbour"}, {"workspace": "ws_control", "flow": "approval"}
        ),
        None,
        svc,
    )
    assert out["statusCode"] == 201 and json.loads(out["body"])["tenant"] == "harbour"
    listed = resolve(people_event("GET", "/runs", {"sub": "u-2", "custom:tenant": "harbour"}), None, svc)
    assert [r["tenant"] for r in json.loads(listed["body"])["runs"]] == ["harbour"]
    assert (
        resolve(people_event("GET", "/runs", {"sub": "u-3", "custom:tenant": "other"}), None, svc)["body"]
        == '{"runs":[],"next":null,"searched":0}'
    )
    assert resolve(people_event("GET", "/runs", {"sub": "u-4"}), None, svc)["statusCode"] == 401
    # The viewer through the people API: assets under its stage.
    page = resolve(people_event("GET", "/", {}), None, svc)
    assert page["statusCode"] == 200 and 'src="/v1/assets/app.js"' in page["body"]
