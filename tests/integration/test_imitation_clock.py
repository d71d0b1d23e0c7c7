"""The imitation's 1-hour cache entries and its fast cache clock, through the real SDK: the
usage splits a write by TTL as the API does, the stats count writes by TTL and cold
prefixes, and at a fast clock an hour's entry outlives fifteen fast minutes while a
five-minute one does not; the clock agrees with laneflow's given the same spec."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

import anthropic
import pytest

from laneflow.domain.cache import CACHE_CLOCK, cache_now
from laneflow_dev.imitation import MessagesImitation

MODEL = "claude-sonnet-4-6"  # minimum cacheable prefix: 2048 tokens
FIVE = "x" * 12_000  # 3,000 tokens
HOUR = "y" * 16_000  # 4,000 tokens
RATE = 600.0  # 15 fast minutes in 1.5 s; a 5-minute entry lasts 0.5 s


def ask(server: MessagesImitation | str, system: Any) -> Any:
    """The usage of one request (to an imitation, or the URL of one)."""
    url = server if isinstance(server, str) else server.url
    client = anthropic.Anthropic(api_key="k", base_url=url, max_retries=0)
    return client.messages.create(model=MODEL, max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}]).usage


def block(text: str, ttl: str | None = None) -> dict[str, Any]:
    cc = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return {"type": "text", "text": text, "cache_control": cc}


def test_usage_and_stats_split_the_writes_by_ttl_and_count_the_cold_prefixes() -> None:
    with MessagesImitation() as server:
        # One request writing both: the hour's breakpoint first (longer TTLs come first), then the 5 minutes'.
        u = ask(server, [block(HOUR, "1h"), block(FIVE)])
        assert u.cache_creation_input_tokens == 7000 and u.cache_read_input_tokens == 0
        assert u.cache_creation.ephemeral_1h_input_tokens == 4000 and u.cache_creation.ephemeral_5m_input_tokens == 3000
        again = ask(server, [block(HOUR, "1h"), block(FIVE)])
        assert again.cache_read_input_tokens == 7000 and again.cache_creation_input_tokens == 0
        # A longer prompt reads the hour's part and writes a new 5-minute tail: a write, not a cold prefix.
        tail = ask(server, [block(HOUR, "1h"), block(FIVE + "z" * 400)])
        assert tail.cache_read_input_tokens == 4000 and tail.cache_creation.ephemeral_5m_input_tokens == 3100
        stats = server.stats()
        assert stats["cache_write_1h_tokens"] == 4000 and stats["cache_write_5m_tokens"] == 3000 + 3100
        assert stats["cache_writes_1h"] == 1 and stats["cache_writes_5m"] == 2 and stats["cache_writes"] == 2
        assert stats["cold_prefixes"] == 1
        assert stats["by_model"][MODEL]["cold_prefixes"] == 1


def test_at_a_fast_clock_an_hours_entry_is_read_after_fifteen_fast_minutes_and_a_five_minute_one_is_not() -> None:
    with MessagesImitation(clock_rate=RATE, clock_epoch=time.time()) as server:
        start = server.now()
        assert ask(server, [block(HOUR, "1h")]).cache_creation.ephemeral_1h_input_tokens == 4000
        assert ask(server, [block(FIVE)]).cache_creation.ephemeral_5m_input_tokens == 3000
        time.sleep(15 * 60 / RATE + 0.1)  # real seconds: 15 minutes on the fast clock
        assert server.now() - start >= 15 * 60
        hour = ask(server, [block(HOUR, "1h")])
        assert hour.cache_read_input_tokens == 4000 and hour.cache_creation_input_tokens == 0
        five = ask(server, [block(FIVE)])
        assert five.cache_read_input_tokens == 0 and five.cache_creation_input_tokens == 3000  # expired: written again


def test_the_clock_agrees_with_laneflows_cache_clock_given_the_same_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    epoch = time.time() - 100  # 100 real seconds ago: 60,000 fast seconds since
    monkeypatch.setenv(CACHE_CLOCK, f"{RATE:g}@{epoch}")
    from_env = MessagesImitation()  # neither given: the environment's clock
    given = MessagesImitation(clock_rate=RATE, clock_epoch=epoch)
    for imitation in (from_env, given):
        assert imitation.now() == pytest.approx(cache_now(f"{RATE:g}@{epoch}"), abs=RATE * 0.05)
        assert imitation.now() - epoch == pytest.approx(100 * RATE, rel=0.01)
    monkeypatch.delenv(CACHE_CLOCK)
    assert MessagesImitation().now() == pytest.approx(time.time(), abs=1)  # the wall clock
    monkeypatch.setenv(CACHE_CLOCK, "fast")
    with pytest.raises(ValueError, match=CACHE_CLOCK):
        MessagesImitation()
    with pytest.raises(ValueError, match="clock_rate"):
        MessagesImitation(clock_rate=0)


def test_the_command_line_takes_the_clock_and_refuses_a_rate_that_is_not_positive() -> None:
    epoch = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "laneflow_dev.imitation", "--port", "0", "--clock-rate", "600", "--clock-epoch", str(epoch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None  # stdout=PIPE
        url = proc.stdout.readline().strip()
        ask(url, [block(FIVE)])
        time.sleep(300 / 600 + 0.2)  # the 5-minute entry's TTL on that clock
        usage = ask(url, [block(FIVE)])
        assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 3000
        stats = json.load(urllib.request.urlopen(url + "/stats"))
        assert stats["cold_prefixes"] == 2
    except BaseException:
        proc.kill()  # the test's own failure is the one to see, not the server's exit
        proc.wait()
        raise
    proc.send_signal(__import__("signal").SIGINT)
    assert proc.wait(timeout=5) == 0
    refused = subprocess.run(
        [sys.executable, "-m", "laneflow_dev.imitation", "--clock-rate", "0"], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 2 and "--clock-rate" in refused.stderr
