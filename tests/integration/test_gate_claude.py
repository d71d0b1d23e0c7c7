"""The warm gate on a Claude model, against the Messages API imitation: a lead whose stable
prefix is below its model's minimum cacheable length holds no sibling (nothing it writes
could be read), and the lane's traces say why; a prefix above it keeps the gate."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FIXTURES, data_of
from pydantic import SecretStr

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.lanes import waiting_line
from laneflow.domain.pricing import catalog
from laneflow.domain.records import Run, RunStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

KEY = "sk-test-0123456789abcdef"
SMALL_MODEL = "claude-haiku-4-5"  # minimum cacheable length 4,096 tokens


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=300, token_ms=1, api_keys={KEY}) as server:
        yield server


def services(tmp_path: Path, api: MessagesImitation) -> Services:
    settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
    return svc


def small_workspace(root: Path) -> Path:
    ws = root / "small"
    (ws / "agents" / "brief").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text(f"---\nmodel: {SMALL_MODEL}\n---\nA small workspace.\n")
    (ws / "agents" / "brief" / "agent.md").write_text(
        "---\ndescription: answers briefly\ntools: [read_file]\n---\nYou answer briefly.\n"
    )
    (ws / "flows" / "fanout.yaml").write_text(
        'description: a small lane\nsteps:\n  - agent: brief\n    each: ["a", "b", "c", "d"]\n'
    )
    return ws


def ts(text: str | None) -> dt.datetime:  # a timestamp the test expects set
    assert text is not None, "a timestamp is missing"
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def drive(svc: Services, ws: Path, flow: str) -> Run:
    run = create_run(svc, ws, flow)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def test_a_prefix_below_the_model_s_minimum_gets_no_gate_and_the_lane_s_traces_say_why(
    tmp_path: Path, api: MessagesImitation
) -> None:
    run = drive(services(tmp_path, api), small_workspace(tmp_path), "fanout")
    assert run.status == RunStatus.completed, run.error
    assert api.stats()["cache_writes"] == 0  # the imitation caches nothing this short either
    lead, *siblings = run.steps
    [note] = [e for e in lead.events if e.type == "gate" and "minimum cacheable length" in e.text]
    minimum = catalog().min_cacheable(SMALL_MODEL)
    assert minimum == 4096 and note.data and note.data["min_cacheable"] == minimum and note.data["prefix_tokens"] < minimum
    assert note.text == (
        f"prompt cache: the brief prefix (~{note.data['prefix_tokens']:,} tokens) is below {SMALL_MODEL}'s minimum"
        " cacheable length (4,096 tokens), so its siblings start at once"
    )
    first_event = ts(lead.calls[0].at) + dt.timedelta(milliseconds=lead.calls[0].ttft_ms or 0)
    for sibling in siblings:
        assert ts(sibling.started_at) <= first_event, f"step {sibling.index} waited for the lead's reply"
        gate_lines = [e.text for e in sibling.events if e.type == "gate"]
        assert note.text in gate_lines, f"step {sibling.index} does not say why it did not wait"


def test_a_prefix_above_the_minimum_keeps_the_gate_and_pays_one_cache_write(tmp_path: Path, api: MessagesImitation) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    run = drive(services(tmp_path, api), ws, "fanout")
    assert run.status == RunStatus.completed, run.error
    assert api.stats()["cache_writes"] == 1
    lead, *siblings = run.steps
    assert not any("minimum cacheable" in e.text for s in run.steps for e in s.events)
    released = [e for e in lead.events if e.type == "gate" and "the lead's reply began" in e.text]
    assert released, "the lead released nobody: its siblings did not wait for its reply"
    for sibling in siblings:
        # Readied while the lead ran (claimed, its request built), its request waited for the reply.
        first = min(sibling.calls, key=lambda c: c.n)
        assert ts(first.at) >= ts(data_of(released[0])["opened_at"]), f"step {sibling.index} sent before the lead replied"
    assert any(e.text == waiting_line("analyst") for s in siblings for e in s.events)
