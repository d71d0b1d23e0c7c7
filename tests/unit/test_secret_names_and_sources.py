"""Declared secrets without a run: the names an agent declares and the names they cross as,
the local sources (dotenv file, the workspace's .secrets.env, the environment), the private
files `@NAME` secrets are given as, and the redactor holding a run's values while its steps
work and dropping them with the last."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.local.secrets import LocalSecrets, PrivateSecretFiles, parse_dotenv
from laneflow.domain.errors import InvalidInput
from laneflow.domain.redaction import Redactor
from laneflow.domain.secrets import crossing_note, declared_secrets, not_set, run_scope, secret_file_folders

VALUE = "s3cr3t-value-0123456789"


# -- names -------------------------------------------------------------------------------------


def test_a_declared_name_crosses_as_itself_unless_the_model_laneflow_or_aws_reads_it() -> None:
    plain, as_file, model, ours, aws = declared_secrets(
        ["API_TOKEN", "@CERT", "ANTHROPIC_API_KEY", "LANEFLOW_STORE", "@AWS_SECRET_ACCESS_KEY"]
    )
    assert (plain.name, plain.as_file, plain.env_name, plain.reserved_by) == ("API_TOKEN", False, "API_TOKEN", None)
    assert (as_file.name, as_file.as_file, as_file.env_name) == ("CERT", True, "CERT")
    assert model.env_name == "LANEFLOW_DECLARED_ANTHROPIC_API_KEY" and model.reserved_by == "the model's own settings"
    assert ours.env_name == "LANEFLOW_DECLARED_LANEFLOW_STORE" and ours.reserved_by == "laneflow's own settings"
    assert aws.env_name == "LANEFLOW_DECLARED_AWS_SECRET_ACCESS_KEY" and aws.as_file
    assert crossing_note(model) == (
        "secret ANTHROPIC_API_KEY crosses as LANEFLOW_DECLARED_ANTHROPIC_API_KEY: a name starting ANTHROPIC_ "
        "belongs to the model's own settings, which a declared secret never replaces"
    )


@pytest.mark.parametrize("entry", ["", "@", "1TOKEN", "MY-TOKEN", "has space", "@@X", "X" * 129])
def test_a_name_that_is_no_variable_name_is_refused_naming_the_agent(entry: Any) -> None:
    with pytest.raises(InvalidInput, match=r"secrets of agent fetcher: .* is not a secret name"):
        declared_secrets([entry], agent="fetcher")


def test_a_name_declared_twice_is_refused() -> None:
    with pytest.raises(InvalidInput, match="TOKEN is declared twice"):
        declared_secrets(["TOKEN", "@TOKEN"], agent="fetcher")


def test_the_missing_secret_reason_names_the_secret_and_the_agent() -> None:
    assert not_set("TOKEN", "fetcher") == "secret TOKEN is not set (declared by agent fetcher)"


# -- dotenv -------------------------------------------------------------------------------------


def test_a_dotenv_file_gives_bare_quoted_and_exported_values() -> None:
    text = (
        "\ufeff# a comment\n\nPLAIN=abc def  # said after\nexport EXPORTED = x=y\nSINGLE='a #b \\n c'\n"
        'DOUBLE="line1\\nline2 \\"q\\" \\\\ #not a comment"\nMULTI="first  \n  second"\nEMPTY=\n'
    )
    assert parse_dotenv(text, "f") == {
        "PLAIN": "abc def",
        "EXPORTED": "x=y",
        "SINGLE": "a #b \\n c",
        "DOUBLE": 'line1\nline2 "q" \\ #not a comment',
        "MULTI": "first  \n  second",
        "EMPTY": "",
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"OK=1\n{VALUE}\n", "line 2: not NAME=value"),
        (f'A="{VALUE}\n', "line 1: its double quote is never closed"),
        (f"A='{VALUE}\n", "line 1: its single quote is never closed"),
        (f'A="{VALUE}" tail\n', "line 1: text after the closing quote"),
    ],
)
def test_a_dotenv_line_that_does_not_parse_is_refused_by_file_and_line_without_its_text(text: Any, said: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_dotenv(text, "the --secrets file")
    assert str(caught.value) == f"the --secrets file, {said}" and VALUE not in str(caught.value)


# -- the local sources ----------------------------------------------------------------------------


def test_the_secrets_file_is_the_only_source_when_given(tmp_path: Path) -> None:
    given = tmp_path / "given.env"
    given.write_text("TOKEN=from-the-file-123\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".secrets.env").write_text("TOKEN=from-the-workspace\nOTHER=from-the-workspace\n")
    source = LocalSecrets(str(given), environ={"OTHER": "from-the-environment"})
    assert source.read("local", str(ws), ["TOKEN", "OTHER"]) == {"TOKEN": "from-the-file-123"}
    assert source.where(str(ws)) == "the --secrets file"


def test_the_workspace_file_comes_next_and_the_environment_only_without_either(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"TOKEN": "from-the-environment", "OTHER": "also-the-environment"}
    source = LocalSecrets(None, environ=env)
    assert source.read("local", str(ws), ["TOKEN"]) == {"TOKEN": "from-the-environment"}
    assert source.where(str(ws)) == "the environment"
    (ws / ".secrets.env").write_text("TOKEN=from-the-workspace\n")
    assert source.read("local", str(ws), ["TOKEN", "OTHER"]) == {"TOKEN": "from-the-workspace"}
    assert source.where(str(ws)) == "the workspace's .secrets.env"


def test_the_environment_never_gives_laneflows_the_models_or_awss_own_variables(tmp_path: Path) -> None:
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-real-key",
        "AWS_SECRET_ACCESS_KEY": "aws-real-secret",
        "LANEFLOW_STORE": "x",
        "TOKEN": "fine-value",
    }
    source = LocalSecrets(None, environ=env)
    assert source.read("local", str(tmp_path), list(env)) == {"TOKEN": "fine-value"}
    named = tmp_path / "named.env"
    named.write_text("ANTHROPIC_API_KEY=the-one-for-the-script\n")  # put in a file on purpose: given
    assert LocalSecrets(str(named), environ=env).read("local", str(tmp_path), ["ANTHROPIC_API_KEY"]) == {
        "ANTHROPIC_API_KEY": "the-one-for-the-script"
    }


def test_a_secrets_file_that_went_away_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="the --secrets file does not exist"):
        LocalSecrets(str(tmp_path / "gone.env")).read("local", str(tmp_path), ["TOKEN"])


# -- @NAME files -----------------------------------------------------------------------------------


def test_a_secret_file_is_0600_in_a_private_0700_folder_of_its_own_and_removed_whole(tmp_path: Path) -> None:
    first = PrivateSecretFiles(str(tmp_path)).write({"CERT": VALUE, "KEY": "k-0123456789"})
    second = PrivateSecretFiles(str(tmp_path)).write({"CERT": VALUE})
    folder = Path(first.paths["CERT"]).parent
    assert folder != Path(second.paths["CERT"]).parent  # one folder per attempt
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name, path in first.paths.items():
        assert Path(path).name == name and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Path(first.paths["CERT"]).read_text() == VALUE
    # A sandbox finds the folder to bind in from the job's variables alone.
    assert secret_file_folders({**first.paths, "TOKEN": VALUE, "OTHER": "/etc/hosts"}) == [str(folder)]
    first.remove()
    first.remove()  # idempotent
    assert not folder.exists() and Path(second.paths["CERT"]).exists()


def test_a_secret_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        files = PrivateSecretFiles(str(tmp_path)).write({"CERT": VALUE})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(files.paths["CERT"]).st_mode) == 0o600


# -- the redactor's run scopes ---------------------------------------------------------------------


def test_a_runs_values_are_masked_while_any_of_its_steps_holds_them_and_dropped_with_the_last() -> None:
    redact = Redactor({"ANTHROPIC_API_KEY": "sk-ant-model-key-0123"})
    scope = run_scope("local", "run-1")
    redact.hold(scope)
    redact.hold(scope)  # two steps of the run work here
    redact.add("TOKEN", VALUE, scope=scope)
    redact.add("SHORT", "1234567", scope=scope)  # under 8 characters: left alone
    assert redact(f"{VALUE} 1234567") == "[TOKEN] 1234567" and redact.held() == [scope]
    redact.release(scope)
    assert redact(VALUE) == "[TOKEN]"  # the other step still works
    redact.release(scope)
    assert redact(VALUE) == VALUE and redact.held() == [] and redact.names() == ["ANTHROPIC_API_KEY"]
    assert redact("sk-ant-model-key-0123") == "[ANTHROPIC_API_KEY]"  # the model's key stays
    assert VALUE not in repr(vars(redact))  # nothing of the value is kept


def test_a_value_added_under_a_scope_nobody_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="not held"):
        Redactor().add("TOKEN", VALUE, scope=run_scope("local", "run-2"))


def test_two_runs_scopes_are_dropped_each_with_its_own_last_step() -> None:
    redact = Redactor()
    one, two = run_scope("local", "run-1"), run_scope("acme", "run-1")
    redact.hold(one)
    redact.hold(two)
    redact.add("TOKEN", "value-of-run-one", scope=one)
    redact.add("TOKEN", "value-of-run-two", scope=two)
    redact.release(one)
    assert redact("value-of-run-one value-of-run-two") == "value-of-run-one [TOKEN]"


# -- Secrets Manager's refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "retryable"), [("AccessDeniedException", False), ("DecryptionFailure", False), ("ThrottlingException", True)]
)
def test_a_secret_secrets_manager_refuses_fails_the_attempt_naming_it_retried_only_when_it_may_pass(
    code: str, retryable: bool
) -> None:
    import boto3
    from botocore.stub import Stubber

    from laneflow.adapters.aws.secrets import SecretsManagerSecrets
    from laneflow.domain.errors import StepFailed

    client = boto3.client("secretsmanager", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("get_secret_value", service_error_code=code, expected_params={"SecretId": "laneflow/acme/TOKEN"})
        with pytest.raises(StepFailed) as caught:
            SecretsManagerSecrets(client).read("acme", "", ["TOKEN"])
    assert caught.value.reason == f"secret TOKEN could not be read from Secrets Manager (laneflow/acme/TOKEN): {code}"
    assert caught.value.retryable is retryable
