"""Tenant names: one check (laneflow.tenants.check_tenant) for every entrance."""

from __future__ import annotations

from typing import Any

import pytest

from laneflow.domain.errors import InvalidInput
from laneflow.domain.tenants import TenantInvalid, check_tenant
from laneflow.settings import Settings


@pytest.mark.parametrize("tenant", ["local", "123456789012", "acme-corp.eu", "ana@example.com", "T_1", "x" * 64])
def test_an_account_id_a_slug_or_an_email_is_a_tenant(tenant: Any) -> None:
    assert check_tenant(tenant) == tenant


@pytest.mark.parametrize(
    "tenant, said",
    [
        ("acme#RUNS", "cannot contain '#'"),
        ("acme/../globex", "cannot contain '/'"),
        ("line\nbreak", "cannot contain '\\n'"),
        ("nul\x00", "cannot contain '\\x00'"),
        ("tab\there", "cannot contain '\\t'"),
        (".hidden", "cannot start with '.'"),
        ("", "is empty"),
        ("t" * 65, "is 65 characters long"),
    ],
)
def test_a_tenant_no_key_can_hold_is_refused_naming_it_and_why(tenant: Any, said: str) -> None:
    with pytest.raises(TenantInvalid) as refused:
        check_tenant(tenant, source="the caller's tenant")
    message = str(refused.value)
    assert message.startswith("the caller's tenant") and said in message
    if tenant:
        assert repr(tenant[:40])[:-1] in message  # named, control characters escaped
    assert isinstance(refused.value, InvalidInput)  # bad input: a 400, exit code 2
    assert "\n" not in message and "\x00" not in message


def test_a_very_long_tenant_is_shown_cut_short() -> None:
    with pytest.raises(TenantInvalid) as refused:
        check_tenant("t" * 10_000)
    assert len(str(refused.value)) < 300


def test_a_bad_LANEFLOW_TENANT_is_refused_naming_the_variable() -> None:
    with pytest.raises(TenantInvalid, match=r"^LANEFLOW_TENANT 'a#b' cannot contain '#'"):
        Settings.from_env({"LANEFLOW_TENANT": "a#b"})
    with pytest.raises(TenantInvalid):
        Settings(tenant="a/b")
    assert Settings.from_env({"LANEFLOW_TENANT": "acme"}).tenant == "acme"
    assert Settings.from_env({}).tenant == "local"


def test_a_bad_setting_in_the_environment_is_refused_naming_its_variables_never_their_values() -> None:
    from laneflow.domain.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        Settings.from_env(
            {"LANEFLOW_HISTORY_BUDGET": "abc", "LANEFLOW_ISOLATION": "s3cr3t-ish", "ANTHROPIC_API_KEY": "sk-ant-xyz"}
        )
    said = str(refused.value)
    assert said.startswith("LANEFLOW_HISTORY_BUDGET: Input should be a valid integer")
    assert "LANEFLOW_ISOLATION: Input should be 'auto' or 'subprocess'" in said
    assert "abc" not in said and "s3cr3t-ish" not in said and "sk-ant" not in said
