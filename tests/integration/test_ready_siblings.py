"""Readied siblings on the embedded engine, against the Messages API imitation: a sibling
waiting at its gate is claimed and built while its lead is in flight, and only its request
waits for the lead's reply. Its prefix is read, never written; a stop while it waits ends it
with no request sent; with LANEFLOW_READY_SIBLINGS off nothing is readied and the gate holds
as before. In the engine's process and with step workers alike."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FIXTURES, data_of
from pydantic import SecretStr

from laneflow.adapters.engine import step_workers
from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.domain.gate import READIED_LINE
from laneflow.domain.records import Event, Run, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=400, token_ms=1, api_keys={KEY}) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_pools() -> Iterator[None]:
    yield
    step_workers.close_all()


def services(tmp_path: Path, api: MessagesImitation, *, workers: int = 0, ready: bool = True) -> Services:
    settings = Settings(
        anthropic_api_key=SecretStr(KEY),
        anthropic_base_url=api.url,
        capture_dir=str(tmp_path / "captures"),
        step_workers=workers,
        ready_siblings=ready,
        prefix_registry=False,  # the gate within one run is what is measured
    )
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'ready.db'}"), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
    return svc


def ts(text: str | None) -> dt.datetime:
    assert text is not None, "a timestamp is missing"
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    return ws


def opened_at(lead_events: list[Event]) -> dt.datetime:
    released = [e for e in lead_events if e.type == "gate" and "the lead's reply began" in e.text]
    assert released, "the lead released nobody: its siblings did not wait for its reply"
    return ts(data_of(released[0])["opened_at"])


@pytest.mark.parametrize("workers", [0, 2])
def test_readied_siblings_send_only_after_the_lead_replied_and_read_its_prefix(
    tmp_path: Path, api: MessagesImitation, workers: int
) -> None:
    svc = services(tmp_path, api, workers=workers)
    engine = local_engine(svc)
    run = create_run(svc, workspace(tmp_path), "fanout")
    final = engine.drive(run.tenant, run.id, tick_s=0.02).run
    assert final.status == RunStatus.completed, final.error
    lead, *siblings = final.steps
    assert len(siblings) >= 2
    assert api.stats()["cache_writes"] == 1 and api.stats()["cache_reads"] == len(siblings)
    assert engine.registry.early is not None and engine.registry.early.started == len(siblings)
    first_event = opened_at(lead.events)
    for sibling in siblings:
        assert any(e.text == READIED_LINE for e in sibling.events), f"step {sibling.index} was not readied"
        assert ts(sibling.started_at) < first_event, f"step {sibling.index} was claimed only after the release"
        request = min(sibling.calls, key=lambda c: c.n)
        assert ts(request.at) >= first_event, f"step {sibling.index} sent its request before the lead replied"
        assert request.tokens.cache_read > 0 and request.tokens.cache_write == 0
    assert not any(e.text == READIED_LINE for e in lead.events)


def test_with_readying_off_the_siblings_start_once_released(tmp_path: Path, api: MessagesImitation) -> None:
    svc = services(tmp_path, api, ready=False)
    engine = local_engine(svc)
    run = create_run(svc, workspace(tmp_path), "fanout")
    final = engine.drive(run.tenant, run.id, tick_s=0.02).run
    assert final.status == RunStatus.completed, final.error
    lead, *siblings = final.steps
    assert api.stats()["cache_writes"] == 1
    assert engine.registry.early is None
    first_event = opened_at(lead.events)
    for sibling in siblings:
        assert not any(e.text == READIED_LINE for e in sibling.events)
        assert ts(sibling.started_at) >= first_event


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stop_while_readied_siblings_wait_ends_them_with_no_request_sent(tmp_path: Path, workers: int) -> None:
    with MessagesImitation(ttft_ms=4000, token_ms=1, api_keys={KEY}) as slow:
        svc = services(tmp_path, slow, workers=workers)
        run = create_run(svc, workspace(tmp_path), "fanout")
        engine = local_engine(svc)
        out: list[Run] = []
        driving = threading.Thread(target=lambda: out.append(engine.drive(run.tenant, run.id, tick_s=0.02).run))
        driving.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # every sibling readied, the lead still waiting for its first token
            steps = svc.store.get_run(run.tenant, run.id).steps
            if sum(1 for s in steps if s.status == StepStatus.running) == len(steps) and slow.received:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the siblings were never readied")
        time.sleep(0.3)  # a request sent early would have arrived by now
        assert len(slow.received) == 1, "a readied sibling sent its request before its lead replied"
        stop_run(svc, run.tenant, run.id, reason="enough")
        driving.join(30)
        assert not driving.is_alive(), "the drive did not end after the stop"
    final = out[0]
    assert final.status == RunStatus.failed and final.stop_requested, (final.status, final.error)
    assert len(slow.received) == 1, "a readied sibling sent its request after the stop"
    assert all(s.status.ended for s in final.steps), [s.status for s in final.steps]
