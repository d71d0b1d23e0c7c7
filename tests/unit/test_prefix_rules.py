"""The prefix registry's rules, under Hypothesis: any sequence of claims, first events, reads,
releases and waits by any runs keeps one writer at most, hands each kept token back exactly
once, and never keeps a token while the prefix is warm; the cache clock's setting is parsed
or refused with the variable named."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.domain import prefixes
from laneflow.domain.cache import cache_now, clock_of
from laneflow.domain.prefixes import WRITER_WAIT_S, PrefixRecord, PrefixWaiter, PrefixWriter

T0 = 1_800_000_000.0

op = st.tuples(
    st.sampled_from(["claim", "began", "release", "wait", "read", "tick"]),
    st.integers(min_value=0, max_value=3),  # which run
    st.floats(min_value=0, max_value=90),  # seconds that pass first
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_any_sequence_keeps_one_writer_and_hands_each_token_back_once(ops: list[tuple[str, int, float]]) -> None:
    record: PrefixRecord | None = None
    now = T0
    kept: set[str] = set()
    handed: list[str] = []
    writers: dict[int, PrefixWriter] = {}
    for n, (kind, run, passes) in enumerate(ops):
        now += passes
        change = prefixes.Change()
        if kind == "claim":
            writer = PrefixWriter(run_id=f"r{run}", index=0, n=1, claimed_at=now)
            found, change = prefixes.claim(record, "k", "m", writer, now)
            if found.state == "write":
                writers[run] = writer
            assert found.state != "wait" or (found.record.writer is not None and not found.record.warm(now))
        elif kind == "began" and run in writers:
            change = prefixes.began(record, "k", "m", f"r{run}", writers.pop(run), now, "5m")
        elif kind == "release" and run in writers:
            change = prefixes.release(record, writers.pop(run))
        elif kind == "wait":
            token = f"t{n}"
            on, change = prefixes.wait(record, PrefixWaiter(token=token, run_id=f"w{run}", index=1, since=now), now)
            if on is not None:
                assert record is not None and record.writing(now) and not record.warm(now)
                kept.add(token)
        elif kind == "read":
            change = prefixes.read(record, "k", "m", f"r{run}", now)
        handed += [w.token for w in change.handed]
        if change.write is not None:
            assert record is None or change.write.version == record.version + 1
            record = change.write
        if record is not None:
            assert len({w.token for w in record.waiters}) == len(record.waiters)
            assert not (set(w.token for w in record.waiters) & set(handed))
    assert len(handed) == len(set(handed)), "a token was handed back twice"
    assert set(handed) <= kept
    left = {w.token for w in record.waiters} if record is not None else set()
    assert kept == set(handed) | left, "a kept token was lost"


def test_a_stale_writer_is_taken_over_and_its_waiters_go_to_the_new_writer() -> None:
    first = PrefixWriter(run_id="a", index=0, n=1, claimed_at=T0)
    _, change = prefixes.claim(None, "k", "m", first, T0)
    assert change.write is not None
    on, change = prefixes.wait(change.write, PrefixWaiter(token="t", run_id="b", index=0, since=T0), T0 + 1)
    assert on is not None and change.write is not None
    second = PrefixWriter(run_id="c", index=0, n=1, claimed_at=T0 + WRITER_WAIT_S + 1)
    taken, change = prefixes.claim(change.write, "k", "m", second, T0 + WRITER_WAIT_S + 1)
    assert taken.state == "write" and change.write is not None and [w.token for w in change.write.waiters] == ["t"]
    assert [w.token for w in prefixes.began(change.write, "k", "m", "c", second, T0 + 62, "5m").handed] == ["t"]


def test_a_step_s_early_claim_is_taken_on_by_its_attempt() -> None:
    early = PrefixWriter(run_id="a", index=3, n=0, claimed_at=T0)
    _, change = prefixes.claim(None, "k", "m", early, T0)
    attempt = PrefixWriter(run_id="a", index=3, n=1, claimed_at=T0 + 1)
    found, change = prefixes.claim(change.write, "k", "m", attempt, T0 + 1)
    assert found.state == "write" and change.write is not None and change.write.writer == attempt
    other = PrefixWriter(run_id="a", index=4, n=1, claimed_at=T0 + 1)
    assert prefixes.claim(change.write, "k", "m", other, T0 + 2)[0].state == "wait"


@given(st.floats(min_value=0.001, max_value=1e4, allow_nan=False), st.floats(min_value=0, max_value=2e9, allow_nan=False))
def test_the_cache_clock_runs_as_fast_as_its_setting_says(rate: float, epoch: float) -> None:
    parsed_rate, parsed_epoch = clock_of(f"{rate!r}@{epoch!r}")
    assert math.isclose(parsed_rate, rate) and math.isclose(parsed_epoch, epoch)


@given(st.text(max_size=30))
def test_a_cache_clock_setting_that_is_not_rate_at_epoch_is_refused_naming_the_variable(text: str) -> None:
    try:
        rate, _ = clock_of(text)
    except ValueError as error:
        assert "LANEFLOW_CACHE_CLOCK" in str(error)
    else:
        assert (text == "" and rate == 1.0) or rate > 0


def test_the_wall_clock_is_the_default_and_a_fast_clock_is_ahead_of_it() -> None:
    assert abs(cache_now() - cache_now(None)) < 1
    an_hour_ago = time.time() - 3600
    assert cache_now(f"60@{an_hour_ago}") > cache_now() + 3600 * 58  # an hour of it is 60 hours
    with pytest.raises(ValueError, match="LANEFLOW_CACHE_CLOCK"):
        clock_of("0@1")
