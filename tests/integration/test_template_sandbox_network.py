"""What a sandbox task may reach in the cloud, read from template.yaml itself: the stack's own
security group (made when SandboxVpcId is given and SandboxSecurityGroups is not) lets the
task out on TCP 80 and 443 only, with no ingress, and the state machine starts the task in
it; given security groups win; on the parameters' defaults the definition keeps them."""

from __future__ import annotations

import copy
import json
from typing import Any

from helpers import ROOT

from laneflow.adapters.engine.template import Template

TEMPLATE = Template.load(ROOT / "template.yaml")


def _with_defaults(**defaults: str) -> Template:
    body = copy.deepcopy(TEMPLATE.body)
    for name, value in defaults.items():
        body["Parameters"][name]["Default"] = value
    return Template(path=TEMPLATE.path, body=body)


def _groups(template: Template) -> Any:
    definition = json.loads(template.definition(lambda lid: f"id-of-{lid}"))
    found = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "SecurityGroups.$":
                    found.add(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(definition)
    return found


def test_the_stacks_sandbox_security_group_lets_out_tcp_80_and_443_only_and_lets_nothing_in() -> None:
    group = TEMPLATE.resources["SandboxSecurityGroup"]
    assert group["Type"] == "AWS::EC2::SecurityGroup" and group["Condition"] == "MakesSandboxSecurityGroup"
    props = group["Properties"]
    assert "SecurityGroupIngress" not in props
    rules = {(r["IpProtocol"], r["FromPort"], r["ToPort"], r["CidrIp"]) for r in props["SecurityGroupEgress"]}
    assert rules == {("tcp", 80, 80, "0.0.0.0/0"), ("tcp", 443, 443, "0.0.0.0/0")}


def test_the_state_machine_starts_the_task_in_the_stacks_group_unless_groups_are_given() -> None:
    assert _groups(TEMPLATE) == {"States.StringSplit('', ',')"}  # the defaults: no VPC, no groups given
    made = _with_defaults(SandboxVpcId="vpc-1")
    subs = made.state_machine()[1]["SandboxSecurityGroups"]
    assert subs["Fn::If"][0] == "MakesSandboxSecurityGroup" and subs["Fn::If"][1] == {"Ref": "SandboxSecurityGroup"}
    assert _groups(made) == {"States.StringSplit('id-of-SandboxSecurityGroup', ',')"}  # the made group's id
    given = _with_defaults(SandboxVpcId="vpc-1", SandboxSecurityGroups="sg-own")
    assert _groups(given) == {"States.StringSplit('sg-own', ',')"}
