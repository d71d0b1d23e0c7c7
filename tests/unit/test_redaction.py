"""Masking secrets: the redactor itself, the store's one write path, and log records."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest

from laneflow.adapters.logs import redact_logs
from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.adapters.store.rulebook import REDACTED_WRITES, UNMASKED_WRITES
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.records import Event, ModelCall, Run, Step, StepStatus
from laneflow.domain.redaction import Redactor
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


def test_a_log_record_of_services_built_by_the_wiring_is_masked(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    from pydantic import SecretStr

    from laneflow.adapters.logs import masked
    from laneflow.adapters.store import open_store
    from laneflow.settings import Settings
    from laneflow.wiring import for_store

    key = "sk-ant-wired-0123456789abcdef"
    svc = for_store(open_store("sqlite:///:memory:"), Settings(capture_dir=str(tmp_path), anthropic_api_key=SecretStr(key)))
    declared = "declared-secret-value-42"
    svc.redactor.add("TOKEN", declared)  # a value known later (a run's secret) is masked from then on
    log = logging.getLogger("laneflow.test_redaction.wired")
    with caplog.at_level(logging.INFO, logger="laneflow.test_redaction.wired"):
        log.info("calling with %s and %s", key, declared)
    assert key not in caplog.text and declared not in caplog.text
    assert "calling with [ANTHROPIC_API_KEY] and [TOKEN]" in caplog.text
    assert masked(f"said {key}") == "said [ANTHROPIC_API_KEY]"  # what the CLI says on stderr, too


def test_the_pure_layers_make_no_process_wide_side_effect() -> None:
    import ast
    from pathlib import Path

    import laneflow

    effects = {"setLogRecordFactory", "basicConfig", "addHandler", "setLevel", "signal", "kill", "_exit", "setsid"}
    library = Path(laneflow.__file__).parent
    found = []
    for layer in ("domain", "ports", "usecases"):
        for path in (library / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in effects:
                    found.append(f"{path.relative_to(library)}:{node.lineno} {node.func.attr}")
    assert found == [], "a process-wide side effect belongs to the wiring or an entrypoint"
