"""Masking secrets: the redactor itself, the store's one write path, and log records."""

from __future__ import annotations

import inspect
import logging

import pytest

from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.adapters.store.rulebook import REDACTED_WRITES, UNMASKED_WRITES
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.records import Event, ModelCall, Run, Step, StepStatus
from laneflow.domain.redaction import Redactor, redact_logs
from laneflow.ports import Store

SECRET = "sk-ant-fake-0123456789abcdef"
READS = ("get_", "list_", "journal_pending", "running_attempts", "active_runs")


def test_every_store_write_is_masked_or_carries_nothing_to_mask() -> None:
    abstract = {name for name, member in vars(Store).items() if getattr(member, "__isabstractmethod__", False)}
    writes = {name for name in abstract if not name.startswith(READS)}
    assert writes == set(REDACTED_WRITES) | UNMASKED_WRITES, "a store write that is neither masked nor said to need none"
    for implementation in (SqliteStore, DynamoStore):
        for name, arguments in REDACTED_WRITES.items():
            method = getattr(implementation, name)
            assert method.__masks__ == arguments, f"{implementation.__name__}.{name} is not masked"
            assert set(arguments) <= set(inspect.signature(method).parameters), f"{name} has no argument of that name"


def test_the_redactor_masks_longest_value_first_and_leaves_short_values_alone() -> None:
    redact = Redactor({"SHORT": "abc1234", "KEY": SECRET, "PART": SECRET[:14]})
    assert redact(f"a {SECRET} and {SECRET[:14]} but abc1234") == "a [KEY] and [PART] but abc1234"
    redact.add("LATER", "declared-later-1")
    assert redact("x declared-later-1") == "x [LATER]" and redact.names() == ["KEY", "LATER", "PART"]


def test_the_redactor_masks_every_string_of_a_record_but_never_its_identity() -> None:
    redact = Redactor({"KEY": SECRET})
    step = Step(
        index=0,
        group=0,
        agent="a",
        instruction=f"use {SECRET}",
        data={SECRET: [f"x{SECRET}", 1, None]},
        events=[Event(text=f"saw {SECRET}", data={"tool": SECRET})],
    )
    run = Run(id=f"run-{SECRET}", workspace="w", flow="f", input={"k": SECRET}, steps=[step])
    masked = redact.value(run)
    assert masked.id == run.id  # a key: a masked record is found where it was written
    assert masked.input == {"k": "[KEY]"}
    got = masked.steps[0]
    assert got.instruction == "use [KEY]" and got.data == {"[KEY]": ["x[KEY]", 1, None]}
    assert (got.events[0].text, got.events[0].data) == ("saw [KEY]", {"tool": "[KEY]"})
    assert got.status is StepStatus.pending and run.input == {"k": SECRET}  # the original is left as it was
    call = ModelCall(id="span-1", model="stub")
    assert redact.value(call) is call  # nothing to mask: the same object, no copy


def test_a_log_record_holding_a_secret_is_masked_in_its_message_and_traceback(caplog: pytest.LogCaptureFixture) -> None:
    redactor = Redactor({"KEY": SECRET})
    redact_logs(redactor)
    log = logging.getLogger("laneflow.test_redaction")
    with caplog.at_level(logging.INFO, logger="laneflow.test_redaction"):
        log.info("calling with %s", SECRET)
        try:
            raise RuntimeError(f"refused {SECRET}")
        except RuntimeError:
            log.exception("it failed")
        log.info("nothing secret here: %s", "plain")
    assert SECRET not in caplog.text
    assert "calling with [KEY]" in caplog.text and "RuntimeError: refused [KEY]" in caplog.text
    assert caplog.records[-1].getMessage() == "nothing secret here: plain"
