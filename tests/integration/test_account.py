"""`--account DIR`: an account-level AGENTS.md under the workspace's. The run keeps it, so
every attempt, which reads the workspace afresh (a retry, a resumed or re-driven attempt),
reads it with the same account."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FIXTURES

from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.records import PromptLayer
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.entrypoints.cli import main

WS = FIXTURES / "ws_interrupt"
ACCOUNT_RULE = "Account-wide rule: every claim names its source."


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'account.db'}"


def agents_md_layer(workspace: Path, agent: str, account: Path | None) -> PromptLayer:
    ws = load_workspace(workspace, account)
    [layer] = [each for each in build_system_prompt(ws, load_agent(ws, agent)).records() if each.name == "agents.md"]
    return layer


@pytest.mark.slow
def test_an_account_agents_md_reaches_every_step_and_every_retry_of_a_run(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    account = tmp_path / "account"
    account.mkdir()
    (account / "AGENTS.md").write_text(f"---\nbudget: 2.5\n---\n{ACCOUNT_RULE}\n")
    assert main(["run", str(WS), "retry", "--account", str(account), "--store", store_url, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "completed"
    assert record["options"]["account"] == str(account.resolve()) and record["options"]["budget"] == 2.5
    flaky = record["steps"][2]
    assert flaky["agent"] == "flaky" and flaky["attempts"] == 2  # its layers are the retry's, read afresh
    for step in record["steps"]:
        [layer] = [each for each in step["prompt_layers"] if each["name"] == "agents.md"]
        assert layer == agents_md_layer(WS, step["agent"], account).model_dump()
        assert layer != agents_md_layer(WS, step["agent"], None).model_dump()  # without it, another layer


def test_a_missing_account_folder_is_refused_before_the_run_starts(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(WS), "retry", "--account", str(tmp_path / "nowhere"), "--store", store_url]) == 2
    assert "no account AGENTS.md at" in capsys.readouterr().err
    assert main(["runs", "--store", store_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
