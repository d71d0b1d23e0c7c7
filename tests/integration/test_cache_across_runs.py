"""The prompt cache across runs, against the Messages API imitation: runs of one flow started
together pay one cold prefix between them (a lead whose prefix another run's lead is writing
waits for that writer's first event, and its trace names the run); a run started after
another finds its prefix warm and holds no sibling; a writer that is gone is released by
reconcile and the step waiting on it starts. Counted by the imitation itself."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FIXTURES, data_of
from pydantic import SecretStr

from laneflow.adapters.executors.anthropic import AnthropicExecutor
from laneflow.adapters.store import open_store
from laneflow.adapters.workers import Liveness
from laneflow.domain.prefixes import PrefixWaiter, PrefixWriter
from laneflow.domain.records import Run, RunStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.reconcile import reconcile
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from laneflow_dev.imitation import MessagesImitation

KEY = "sk-test-0123456789abcdef"
EXE = Path(sys.executable).parent / "laneflow"


@pytest.fixture
def api() -> Iterator[MessagesImitation]:
    with MessagesImitation(ttft_ms=400, token_ms=1, api_keys={KEY}) as server:
        yield server


def services(tmp_path: Path, api: MessagesImitation) -> Services:
    settings = Settings(anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "captures"))
    svc = for_store(open_store(f"sqlite:///{tmp_path / 'cache.db'}"), settings)
    svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
    return svc


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_claude", ws)
    return ws


def drive_together(svc: Services, ws: Path, n: int) -> list[Run]:
    runs = [create_run(svc, ws, "fanout") for _ in range(n)]
    done: dict[str, Run] = {}

    def drive(run: Run) -> None:
        done[run.id] = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run

    threads = [threading.Thread(target=drive, args=(run,)) for run in runs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    return [done[run.id] for run in runs]


def ts(text: str | None) -> dt.datetime:
    assert text is not None, "a timestamp is missing"
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def gate_lines(run: Run) -> list[str]:
    return [e.text for s in run.steps for e in s.events if e.type == "gate"]


def test_three_runs_started_together_pay_one_cold_prefix_and_the_waiting_leads_name_the_writer(
    tmp_path: Path, api: MessagesImitation
) -> None:
    svc = services(tmp_path, api)
    runs = drive_together(svc, workspace(tmp_path), 3)
    assert all(r.status == RunStatus.completed for r in runs), [r.error for r in runs]
    assert api.stats()["cache_writes"] == 1, api.stats()
    assert api.stats()["cache_reads"] == 11  # 12 steps, one wrote
    writers = [r for r in runs if any(s.calls and s.calls[0].tokens.cache_write for s in r.steps)]
    assert len(writers) == 1
    waited = [
        data_of(e)
        for r in runs
        for s in r.steps
        for e in s.events
        if e.type == "gate" and "which is writing this prefix now" in e.text
    ]
    warm = [line for r in runs for line in gate_lines(r) if "prefix warm since" in line]
    # Each other run's lead either waited for the writer (and its trace names its run) or,
    # arriving after the writer's reply began, found the prefix warm.
    assert len(waited) + len(warm) >= 2
    assert all(d["waits_for"] == writers[0].id for d in waited)
    assert all(f"(run {writers[0].id})" in line for line in warm)


def test_a_run_started_after_another_finds_its_prefix_warm_and_holds_no_sibling(tmp_path: Path, api: MessagesImitation) -> None:
    svc = services(tmp_path, api)
    ws = workspace(tmp_path)
    [first] = drive_together(svc, ws, 1)
    [second] = drive_together(svc, ws, 1)
    assert first.status == second.status == RunStatus.completed
    assert api.stats()["cache_writes"] == 1  # the second run wrote nothing
    lead = second.steps[0]
    [warm] = [e for e in lead.events if e.type == "gate" and "prefix warm since" in e.text]
    assert data_of(warm)["warmed_by"] == first.id and f"(run {first.id})" in warm.text
    # The lead opened its gate for the warm prefix, not at its first token: every sibling, kept
    # waiting or passing an open gate, was handed the warm line as its reason to start.
    for sibling in second.steps[1:]:
        assert warm.text in [e.text for e in sibling.events if e.type == "gate"], sibling.index
        assert sibling.calls[0].tokens.cache_read > 0
    assert lead.calls[0].tokens.cache_read > 0 and lead.calls[0].tokens.cache_write == 0


def test_reconcile_releases_a_writer_whose_attempt_is_gone_and_hands_its_waiters_back(
    tmp_path: Path, api: MessagesImitation
) -> None:
    svc = services(tmp_path, api)
    [run] = drive_together(svc, workspace(tmp_path), 1)  # a run whose step 0 attempt 1 has ended
    now = svc.cache_now()
    gone = PrefixWriter(run_id=run.id, index=0, n=1, claimed_at=now)
    key = "a-prefix-nobody-is-writing"
    assert svc.store.prefix_claim(run.tenant, key, model="claude-sonnet-4-6", writer=gone, now=now).state == "write"
    waiter = PrefixWaiter(token="tok-waiting", run_id="another-run", index=2, since=now)
    assert svc.store.prefix_wait(run.tenant, key, waiter, now=now) is not None
    completed: list[str] = []

    class Callbacks:
        def succeed(self, token: str, output: dict[str, object]) -> None:
            completed.append(token)

        def succeed_all(self, tokens: list[str], output: dict[str, object]) -> list[str]:
            completed.extend(tokens)
            return []

    svc.callbacks = Callbacks()  # type: ignore[assignment]
    report = reconcile(svc, Liveness())
    assert any(key in line for line in report.lines()), report.lines()
    assert completed == ["tok-waiting"]
    record = svc.store.get_prefix(run.tenant, key)
    assert record is not None and record.writer is None and record.waiters == []


def test_two_laneflow_run_processes_on_one_store_pay_one_cold_prefix(tmp_path: Path, api: MessagesImitation) -> None:
    """Two engines, one store: a lead waiting in one process for the other's writer is
    handed back by its own process's watch of the record (a token is its engine's)."""
    ws = workspace(tmp_path)
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": api.url, "LANEFLOW_STEP_WORKERS": "0"}
    procs = [
        subprocess.Popen(
            [str(EXE), "run", str(ws), "fanout", "--store", store, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    runs = [json.loads(out)["run"] if "run" in json.loads(out) else json.loads(out) for out, _ in outs]
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert api.stats()["cache_writes"] == 1, api.stats()
    assert api.stats()["cache_reads"] == 7
    [writer] = [r["id"] for r in runs if r["steps"][0]["calls"][0]["tokens"]["cache_write"]]
    [other] = [r for r in runs if r["id"] != writer]
    named = [e["text"] for e in other["steps"][0]["events"] if e["type"] == "gate" and writer in e["text"]]
    assert named, "the other run's lead neither waited for the writer nor found its prefix warm from it"


def test_runs_fifteen_minutes_apart_write_their_prefix_once_an_hour_with_auto(tmp_path: Path) -> None:
    """On a clock 300 times as fast (the imitation's and laneflow's the same): the second run,
    15 cache-minutes after the first, finds its prefix expired, last used 15 minutes ago, so
    `auto` writes it for an hour; the third, 15 minutes later, reads it."""
    rate, epoch = 300.0, time.time()
    clock = f"{rate}@{epoch}"
    with MessagesImitation(ttft_ms=50, token_ms=0, api_keys={KEY}, clock_rate=rate, clock_epoch=epoch) as api:
        settings = Settings(
            anthropic_api_key=SecretStr(KEY), anthropic_base_url=api.url, capture_dir=str(tmp_path / "c"), cache_clock=clock
        )
        svc = for_store(open_store(f"sqlite:///{tmp_path / 'ttl.db'}"), settings)
        svc.executors["anthropic"] = AnthropicExecutor(api_key=KEY, base_url=api.url, backoff_s=0.01)
        ws = workspace(tmp_path)
        runs = []
        for n in range(3):
            if n:
                time.sleep(900 / rate)  # 15 cache-minutes after the last run's last read
            [run] = drive_together(svc, ws, 1)
            runs.append(run)
        stats = api.stats()
    assert all(r.status == RunStatus.completed for r in runs), [r.error for r in runs]
    first, second, third = (r.steps[0] for r in runs)
    assert first.cache_ttl == "5m" and first.cache_ttl_reason and first.cache_ttl_reason.startswith("auto:")
    assert second.cache_ttl == "1h", second.cache_ttl_reason
    assert "last" in (second.cache_ttl_reason or "")
    assert second.calls[0].tokens.cache_write_1h > 0
    assert third.calls[0].tokens.cache_read > 0 and third.calls[0].tokens.cache_write == 0
    assert (stats["cache_writes_5m"], stats["cache_writes_1h"]) == (1, 1), stats
    assert second.savings_usd < 0 < third.savings_usd  # a write costs beyond input; a read saves
