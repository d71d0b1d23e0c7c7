"""The Claude executor through the real anthropic SDK against the local Messages API
imitation (real HTTP, streaming, prompt-cache semantics), driven by the real definition."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, data_of, error_of, wait_for
from pydantic import SecretStr

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.errors import ModelNotConfigured
from laneflow.domain.pricing import catalog
from laneflow.domain.records import Run, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation, Reply

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", root)
    return root


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=300, token_ms=1, api_keys={KEY}) as server:
        yield server


def services(tmp_path: Path, api: MessagesImitation, key: str = KEY) -> Services:
    settings = Settings(anthropic_api_key=SecretStr(key), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'claude.db'}"), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=key, base_url=api.url, backoff_s=0.01)
    return svc


def drive(svc: Services, ws: Path, flow: str, **kwargs: Any) -> Run:
    run = create_run(svc, ws, flow, **kwargs)
    return local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run


def drive_until(tmp_path: Path, ws: Path, imitation: MessagesImitation, counter: str) -> tuple[Services, Run, threading.Thread]:
    """The `tools` flow driven on a thread of its own against `imitation`, returned once the
    imitation's `counter` stat has counted the step's first request (or after 30 s)."""
    import time

    svc = services(tmp_path, imitation)
    run = create_run(svc, ws, "tools")
    thread = threading.Thread(target=local_engine(svc).drive, args=(run.tenant, run.id), kwargs={"tick_s": 0.02})
    thread.start()
    deadline = time.monotonic() + 30
    while imitation.stats()[counter] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return svc, run, thread


def test_a_gated_fan_out_pays_one_cache_write_and_every_sibling_reads(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "fanout")
    assert run.status == RunStatus.completed, run.error
    stats = api.stats()
    assert stats["cache_writes"] == 1 and stats["cache_reads"] == 3
    lead, *siblings = run.steps
    written = lead.calls[0].tokens.cache_write
    assert written > 2048 and lead.calls[0].tokens.cache_read == 0
    for sibling in siblings:
        first = sibling.calls[0].tokens
        assert first.cache_read == written and first.cache_write == 0
    assert stats["cache_write_tokens"] == written and stats["cache_read_tokens"] == 3 * written


def test_without_the_gate_every_step_of_the_fan_out_writes_the_prefix(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "fanout", options={"gate": False})
    assert run.status == RunStatus.completed
    stats = api.stats()
    assert stats["cache_writes"] == 4 and stats["cache_reads"] == 0


def test_lanes_are_keyed_by_agent_one_cold_prefix_each(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "two_lanes")
    assert run.status == RunStatus.completed, run.error
    assert api.stats()["cache_writes"] == 2 and api.stats()["cache_reads"] == 4
    assert {s.model for s in run.steps if s.agent == "reviewer"} == {"claude-haiku-4-5"}


def test_lanes_are_keyed_by_model_one_cold_prefix_each(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "same_agent_two_models")
    assert run.status == RunStatus.completed, run.error
    by_model = api.stats()["by_model"]
    assert by_model["claude-sonnet-4-6"]["cache_writes"] == 1 and by_model["claude-sonnet-4-6"]["cache_reads"] == 1
    assert by_model["claude-haiku-4-5"]["cache_writes"] == 1 and by_model["claude-haiku-4-5"]["cache_reads"] == 1


def test_spans_record_usage_ttft_and_cost_from_the_catalog(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "fanout")
    step = run.steps[1]
    [call] = step.calls
    assert call.id.startswith("msg_") and call.model == "claude-sonnet-4-6" and call.stop == "end_turn"
    assert call.ttft_ms is not None and call.ms is not None
    assert call.ttft_ms >= 250 and call.ms >= call.ttft_ms
    assert call.tokens.input > 0 and call.tokens.output > 0
    price = catalog().price("claude-sonnet-4-6")
    assert price is not None
    assert call.cost_usd == pytest.approx(price.cost(call.tokens), rel=1e-6)
    # the store keeps costs to the micro-dollar
    assert step.cost_usd == pytest.approx(call.cost_usd, abs=1e-6)
    assert run.cost_usd == pytest.approx(sum(s.cost_usd for s in run.steps), abs=1e-6)


def test_the_system_prompt_is_cached_stable_first_and_tools_are_sorted(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    seen: list[dict[str, Any]] = []
    original = api.responder

    def spy(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return original(body)

    api.responder = spy
    drive(services(tmp_path, api), ws, "tools")
    body = seen[0]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "Today is" not in body["system"][0]["text"]  # the clock is dynamic, after the breakpoint
    assert "Today is" in body["system"][1]["text"] and "cache_control" not in body["system"][1]
    names = [t["name"] for t in body["tools"]]
    assert names == sorted(names)


def test_a_tool_use_loop_writes_files_and_records_each_call(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "tools")
    assert run.status == RunStatus.completed, run.error
    step = run.steps[0]
    assert (ws / "storage" / "note.md").read_text() == "tides are long waves"
    tools = [e for e in step.events if e.type == "tool"]
    assert [data_of(e)["tool"] for e in tools] == ["write_file", "read_file"]
    capture = json.loads((tmp_path / "captures" / data_of(tools[1])["capture"]).read_text())
    assert capture["output"] == "tides are long waves"
    assert [c.stop for c in step.calls] == ["tool_use", "tool_use", "end_turn"]
    assert [c.n for c in step.calls] == [1, 2, 3] and len({c.id for c in step.calls}) == 3
    assert step.conclusion == "The note is written."


def test_max_turns_is_honoured(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    run = drive(services(tmp_path, api), ws, "too_many_turns")
    step = run.steps[0]
    assert step.status == StepStatus.failed and step.error == "reached max_turns (4) before a final reply"
    assert len(step.calls) == 4


def test_overloaded_and_rate_limited_answers_are_retried_with_backoff(tmp_path: Path, ws: Path, api: MessagesImitation) -> None:
    api.fail_next(529, 429)
    run = drive(services(tmp_path, api), ws, "tools")
    assert run.status == RunStatus.completed, run.error
    warnings = [e.text for e in run.steps[0].events if e.type == "warning"]
    assert len(warnings) == 2 and "529" in warnings[0] and "429" in warnings[1]
    assert run.steps[0].attempts == 1


def test_an_authentication_refusal_is_a_clear_failure_that_is_not_retried_and_keeps_the_key_secret(
    tmp_path: Path, ws: Path, api: MessagesImitation
) -> None:
    bad = "sk-wrong-key-abcdefghijklmnop"
    run = drive(services(tmp_path, api, key=bad), ws, "fanout")
    assert run.status == RunStatus.failed
    lead = run.steps[0]
    assert lead.attempts == 1 and "authentication failed" in error_of(lead) and "ANTHROPIC_API_KEY" in error_of(lead)
    assert bad not in json.dumps(run.public())


def test_a_step_timeout_is_honoured(tmp_path: Path, ws: Path) -> None:
    with MessagesImitation(ttft_ms=3000, api_keys={KEY}) as slow:
        (ws / "agents" / "toolsmith" / "agent.md").write_text("---\ntimeout: 1\n---\nYou are slow.\n")
        run = drive(services(tmp_path, slow), ws, "tools")
    step = run.steps[0]
    assert step.status == StepStatus.failed and step.error == "timed out after 1 s"


def test_a_non_stub_model_without_an_api_key_is_refused_before_the_run_starts(tmp_path: Path, ws: Path) -> None:
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'nokey.db'}"), Settings())
    with pytest.raises(ModelNotConfigured, match="ANTHROPIC_API_KEY"):
        create_run(svc, ws, "fanout")
    assert svc.store.list_runs("local") == []


def test_an_agent_budget_stops_a_claude_step_mid_turn_counting_cache_writes(
    tmp_path: Path, ws: Path, api: MessagesImitation
) -> None:
    """The analyst's first turn writes a 5,000-token prefix (at the cache-write price); a cap
    below that cost stops the step as soon as the stream reports its usage."""
    agent = ws / "agents" / "analyst" / "agent.md"
    agent.write_text(agent.read_text().replace("tools: [read_file, list_files]", "tools: [read_file, list_files]\nbudget: 0.005"))
    run = drive(services(tmp_path, api), ws, "fanout", options={"gate": False})
    step = run.steps[0]
    assert step.status == StepStatus.failed and error_of(step).startswith("stopped at its budget")
    [call] = step.calls
    assert call.tokens.cache_write > 4000 and call.tokens.output <= 1
    price = catalog().price("claude-sonnet-4-6")
    assert price is not None
    assert call.cost_usd == pytest.approx(price.cost(call.tokens), rel=1e-6) and call.cost_usd > 0.005
    assert step.cost_usd == pytest.approx(call.cost_usd, abs=1e-6) and step.attempts == 1


def test_a_stop_ends_a_claude_call_still_waiting_for_its_first_token(tmp_path: Path, ws: Path) -> None:
    """20 s to the first token; the stop comes 0.5 s into the call: the request is ended at
    once (the imitation sees the connection closed during its prefill), the step ends long
    before the prefill would have, and its attempt records that it was stopped."""
    import time

    from laneflow.adapters.executors.anthropic import STOPPED_BEFORE_REPLY
    from laneflow.domain.records import AttemptStatus
    from laneflow.usecases.stop import stop_run

    with MessagesImitation(ttft_ms=20000, api_keys={KEY}) as slow:
        svc, run, drive = drive_until(tmp_path, ws, slow, "requests")
        time.sleep(0.5)
        stop_run(svc, run.tenant, run.id)
        # The step ended, and the server saw the connection closed, while its 20 s prefill
        # still had most of its time to run (the waits give up at half of it)
        wait_for(lambda: svc.store.get_step(run.tenant, run.id, 0).status != StepStatus.running, "the step's end", timeout_s=10)
        disconnects = wait_for(lambda: slow.stats()["disconnects"], "the disconnect", timeout_s=8)
        drive.join(timeout=10)
    assert disconnects == 1
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert step.status == StepStatus.failed and step.error == STOPPED_BEFORE_REPLY
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    assert attempt.status == AttemptStatus.stopped and attempt.reason == STOPPED_BEFORE_REPLY
    assert not drive.is_alive() and svc.store.get_run(run.tenant, run.id).status == RunStatus.failed


def test_the_run_budget_lets_a_claude_step_begin_no_turn_once_it_is_spent(
    tmp_path: Path, ws: Path, api: MessagesImitation
) -> None:
    """The toolsmith's three-turn loop under a run budget its first turn already spends: the
    second turn is never asked for; the step fails "budget spent", and so does the run."""
    flow = (ws / "flows" / "tools.yaml").read_text()
    (ws / "flows" / "tight.yaml").write_text("budget: 0.0001\n" + flow)
    seen: list[dict[str, Any]] = []
    original = api.responder
    api.responder = lambda body: (seen.append(body), original(body))[1]  # type: ignore[func-returns-value]
    run = drive(services(tmp_path, api), ws, "tight")
    step = run.steps[0]
    assert len(seen) == 1 and [c.stop for c in step.calls] == ["tool_use"]
    assert step.status == StepStatus.failed and step.attempts == 1
    assert error_of(step).startswith("budget spent: $") and "model turn 2" in error_of(step)
    assert run.status == RunStatus.failed and error_of(run).startswith("budget spent: $")
    assert run.cost_usd == pytest.approx(step.calls[0].cost_usd, abs=1e-6) and run.cost_usd > 0.0001


def test_a_stop_ends_a_claude_call_whose_response_headers_have_not_arrived(tmp_path: Path, ws: Path) -> None:
    """The API (or a proxy in front of it) holds the response's headers for 30 s: the request
    is sent and nothing comes back. A stop issued while it waits ends the call there and then
    (the imitation sees the connection closed while it holds), and the run ends stopped
    with nothing left running, not when the headers would have come."""
    import time

    from laneflow.adapters.executors.anthropic import STOPPED_BEFORE_REPLY
    from laneflow.domain.records import AttemptStatus
    from laneflow.usecases.stop import stop_run

    with MessagesImitation(hold_headers_ms=30_000, api_keys={KEY}) as held:
        svc, run, drive = drive_until(tmp_path, ws, held, "held")
        assert held.stats()["held"] == 1, "the request never reached the imitation"
        time.sleep(0.3)  # the request is written and the caller is reading for the status line
        stop_run(svc, run.tenant, run.id)
        drive.join(timeout=15)  # the headers are held 30 s: ended within this bound, the stop ended it
        stats = held.stats()
    assert not drive.is_alive(), "the stop did not end the run while the headers were held"
    assert stats["disconnects"] == 1 and stats["requests"] == 0  # ended while held: no answer was ever sent
    stored = svc.store.get_run(run.tenant, run.id, detail=True)
    assert stored.status == RunStatus.failed and stored.stop_requested and stored.finished_at
    assert not [s for s in stored.steps if s.status in (StepStatus.running, StepStatus.pending)]
    step = stored.steps[0]
    assert step.status == StepStatus.failed and step.error == STOPPED_BEFORE_REPLY
    [attempt] = svc.store.list_attempts(run.tenant, run.id, 0)
    assert attempt.status == AttemptStatus.stopped and attempt.reason == STOPPED_BEFORE_REPLY
    assert not [a for _, a in svc.store.running_attempts() if a.run_id == run.id]
