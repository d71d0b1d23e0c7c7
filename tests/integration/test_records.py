"""What the record says, on both stores and through the real definition on the engine:
- a retried or resumed step is told the truth about each earlier attempt, and the user
  message its latest attempt was sent is kept on the step (`message`);
- a run that ends leaves no step pending: what did not run is skipped, with the reason;
- the model's key and every declared secret are never stored in clear: not in the store
  (SQLite file, DynamoDB items, S3 blobs), the captures, the on-end hook's events or the
  logs; a run's secrets are dropped when it ends."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import DYNAMODB_BUCKET as BUCKET
from helpers import DYNAMODB_REGION as REGION
from helpers import DYNAMODB_TABLE as TABLE
from helpers import (
    FIXTURES,
    FlowRunner,
    ServicesOn,
    data_of,
    drive,
    error_of,
    message_of,
    read_capture,
    result_of,
    stored_bytes,
    write_workspace,
)
from pydantic import SecretStr

import laneflow.usecases.run_step.runner as step_module
from laneflow.adapters.store import open_store
from laneflow.adapters.workers import Liveness
from laneflow.domain.flow import StepSpec
from laneflow.domain.records import AttemptStatus, FailureKind, Run, RunChanges, RunStatus, StepChanges, StepStatus, utcnow
from laneflow.domain.workers import LambdaRequest
from laneflow.entrypoints.cli import main
from laneflow.ports import Services, StepOutcome
from laneflow.settings import Settings
from laneflow.usecases.approve import answer_approval
from laneflow.usecases.reconcile import interrupt, reconcile
from laneflow.usecases.run_step.output import check_output
from laneflow.usecases.start_run import create_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import for_store, local_engine

SEM = FIXTURES / "ws_semantics"
CTRL = FIXTURES / "ws_control"
KEY = "sk-ant-fake-" + "0123456789abcdef" * 3  # a long fake model key; the model stays stub
MASK = "[ANTHROPIC_API_KEY]"
GONE = LambdaRequest(request_id="gone", deadline=0)  # a worker long past its deadline


def assert_no_step_pending(run: Run) -> None:
    assert run.status.ended, run.status
    left = [(s.index, s.status) for s in run.steps if s.status in (StepStatus.pending, StepStatus.awaiting_approval)]
    assert left == [], f"an ended run left steps waiting: {left}"


# -- item: a retry is told the truth; the step keeps its message ---------------------------------


def test_a_retry_after_an_invalid_output_is_told_its_own_output_was_refused_not_that_it_was_not_its_choice(
    on: ServicesOn,
) -> None:
    svc = on()
    run = drive(svc, SEM, "retry")
    assert run.status == RunStatus.completed, run.error
    flaky, post = run.steps
    first = svc.store.list_attempts(run.tenant, run.id, post.index)[0]
    assert (first.status, first.reason_kind) == (AttemptStatus.failed, FailureKind.output)
    # The message kept is the second attempt's: it says the output was refused, and why.
    told = message_of(post)
    assert "- attempt 1 replied, but its own output was refused: the output does not match its schema:" in told
    assert "Fix that in this attempt." in told and "not by its own choice" not in told
    assert told.startswith("Make a post record.") and "JSON Schema" in told
    # A model error is told as one, and is not the step's choice.
    assert svc.store.list_attempts(run.tenant, run.id, flaky.index)[0].reason_kind == FailureKind.model
    told = message_of(flaky)
    assert "- attempt 1 ended with a model or network error, not by its own choice: the model was overloaded." in told


def test_a_step_resumed_after_its_worker_went_away_is_told_it_was_interrupted_not_by_its_own_choice(on: ServicesOn) -> None:
    svc = on()
    run = create_run(svc, SEM, "handoff", {"things": ["tides"]})
    # Given a drive whose worker died while it ran step 0
    svc.store.update_run(run.tenant, run.id, RunChanges(status=RunStatus.running, driver=GONE), add_drives=1)
    attempt = svc.store.claim_attempt(
        run.tenant, run.id, 0, token="t" * 16, started_at=utcnow(), worker=GONE, message="Scout tides for ."
    )
    assert interrupt(svc, run.tenant, run, attempt) == "interrupted"
    # When the next drive runs it
    final = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02).run
    # Then the step's message (its second attempt's) tells the truth about the first
    assert final.status == RunStatus.completed, final.error
    scout = final.steps[0]
    assert scout.attempts == 2
    assert "- attempt 1 was interrupted: its worker went away, not by its own choice." in message_of(scout)
    assert "may already have done part of the work" in message_of(scout)
    assert "- attempt" not in message_of(final.steps[1])  # a step tried once is told nothing of the kind


def test_each_step_keeps_the_message_its_latest_attempt_was_sent(on: ServicesOn) -> None:
    svc = on()
    run = drive(svc, SEM, "handoff", {"things": ["tides", "reefs"], "audience": "kids"})
    assert run.status == RunStatus.completed, run.error
    scout, summarizer, fixer, lister = run.steps[0], run.steps[2], run.steps[3], run.steps[4]
    assert scout.message == "Scout tides for kids."
    assert message_of(summarizer).startswith("Summarize the results.\n\n## Handoff from the previous group")
    assert "Found tides." in message_of(summarizer) and "Conclusion about reefs." in message_of(summarizer)
    assert "Found tides." not in message_of(fixer) and "Conclusion about tides." in message_of(fixer)
    assert lister.message == "List without a handoff."
    # A fresh reader of the same store sees it too (it is stored, not kept in memory).
    fresh = open_store(svc.store.url).get_run(run.tenant, run.id)
    assert [s.message for s in fresh.steps] == [s.message for s in run.steps]


@pytest.mark.slow
def test_a_message_larger_than_a_dynamodb_item_is_kept_whole(on: ServicesOn, tmp_path: Path) -> None:
    svc = on()
    big = "tide " * 90_000  # 450 KB: past DynamoDB's 400 KB item, let alone its 64 KB blob threshold
    ws = write_workspace(
        tmp_path / "ws",
        {"talker": {"stub": big}, "reader": {}},
        {"big": {"steps": [{"agent": "talker"}, {"agent": "reader", "instruction": "Read it."}]}},
    )
    run = drive(svc, ws, "big")
    assert run.status == RunStatus.completed, run.error
    reader = run.steps[1]
    told = message_of(reader)
    assert len(told) > 450_000 and told.startswith("Read it.") and big.strip() in told
    if on.kind == "dynamodb":  # kept in S3, the step item holds a pointer (under `m`, the message's short name)
        item = boto3.client("dynamodb", region_name=REGION).get_item(
            TableName=TABLE, Key={"pk": {"S": f"T#local#R#{run.id}"}, "sk": {"S": "S#00000001"}}, ConsistentRead=True
        )["Item"]
        assert item["m"]["M"]["s3"]["S"].startswith(f"s3://{BUCKET}/")


def test_the_message_is_in_the_json_record_the_api_record_and_show(svc: Services, capsys: pytest.CaptureFixture[str]) -> None:
    from api_calls import call

    things = {"things": ["tides"], "audience": "kids"}
    theirs = drive(svc, SEM, "handoff", things, tenant="acme")
    status, record, _ = call(svc, "GET", f"/runs/{theirs.id}")  # the API, as tenant acme
    assert status == 200 and record["steps"][0]["message"] == "Scout tides for kids."
    run = drive(svc, SEM, "handoff", things)
    assert main(["show", run.id, "--store", svc.store.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][1]["message"].startswith("Summarize the results.")
    assert main(["show", run.id, "--store", svc.store.url]) == 0
    text = capsys.readouterr().out
    assert "message: Scout tides for kids. (21 chars)" in text
    assert "message: Summarize the results. (" in text


# -- item: a run that ends leaves no step pending -------------------------------------------------


def test_a_run_that_spends_its_budget_skips_every_step_it_did_not_run_budget_spent(run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "budget").run
    assert error_of(run).startswith("budget spent")
    assert_no_step_pending(run)
    writer = run.steps[2]
    assert (writer.status, writer.skip_reason, writer.attempts) == (StepStatus.skipped, "budget spent", 0)


def test_a_rescue_left_pending_when_the_budget_ends_the_run_is_skipped_budget_spent(svc: Services, tmp_path: Path) -> None:
    ws = write_workspace(
        tmp_path / "ws",
        {
            "spendthrift": {"stub": "delay_ms: 1000\ncost: 0.10\nSpent it all."},
            "failer": {"stub": "fail: cannot"},
            "rescuer": {},
            "writer": {},
        },
        {
            "broke": {
                "budget": 0.05,
                "steps": [
                    {"group": [{"agent": "spendthrift"}, {"agent": "failer", "retries": 0, "on_fail": "rescuer"}]},
                    {"agent": "writer"},
                ],
            }
        },
    )
    # The group spends the budget and one of its steps fails: its rescue is added, never run.
    # Both steps start together, before any spend (the budget is checked as each starts);
    # the spender records its cost a second later, when the other has long failed.
    run = drive(svc, ws, "broke")
    assert run.status == RunStatus.failed and error_of(run).startswith("budget spent")
    assert_no_step_pending(run)
    [rescue] = [s for s in run.steps if s.rescue_of == 1]
    assert (rescue.status, rescue.skip_reason, rescue.attempts) == (StepStatus.skipped, "budget spent", 0)
    assert run.steps[2].skip_reason == "budget spent"


def test_a_run_that_fails_skips_its_later_steps_the_run_failed_before_this_step(run_flow: FlowRunner) -> None:
    run = run_flow(SEM, "required_fails").run
    assert run.status == RunStatus.failed
    assert_no_step_pending(run)
    later = [s for s in run.steps if s.status == StepStatus.skipped]
    assert later and all(s.skip_reason == "the run failed before this step" and s.attempts == 0 for s in later)


def test_a_rejected_run_skips_its_later_steps_rejected_by_a_person(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "approval").run
    assert run.status == RunStatus.awaiting_approval
    answer_approval(svc, run.tenant, run.id, approve=False)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.failed and final.error == "rejected by a person"
    assert_no_step_pending(final)
    approval, poster = final.steps[1], final.steps[2]
    assert approval.status == StepStatus.failed and (poster.status, poster.skip_reason) == (
        StepStatus.skipped,
        "rejected by a person",
    )


def test_a_stopped_parked_run_skips_its_approval_and_later_steps_run_stopped(svc: Services, run_flow: FlowRunner) -> None:
    run = run_flow(CTRL, "approval").run
    stop_run(svc, run.tenant, run.id)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.failed and final.finished_at
    assert_no_step_pending(final)
    assert [(s.status, s.skip_reason) for s in final.steps[1:]] == [(StepStatus.skipped, "run stopped")] * 2


def test_a_run_closed_past_its_drive_limit_skips_what_did_not_run(svc: Services) -> None:
    run = create_run(svc, CTRL, "rescue")
    # Given a run whose drive went away as often as it may, while step 0 ran
    svc.store.update_run(
        run.tenant, run.id, RunChanges(status=RunStatus.running, driver=GONE), add_drives=svc.settings.max_drives
    )
    svc.store.claim_attempt(run.tenant, run.id, 0, token="t" * 16, started_at=utcnow(), worker=GONE)
    # When reconcile closes it
    report = reconcile(svc, Liveness(), redrive=lambda r: pytest.fail("re-drove a run past its drive limit"))
    assert report.closed == [run.id]
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.failed and "GaveUp" in error_of(final)
    assert_no_step_pending(final)
    begun, *rest = final.steps
    assert (begun.status, begun.skip_reason) == (StepStatus.skipped, "the run failed before this step finished")
    assert all((s.status, s.skip_reason) == (StepStatus.skipped, "the run failed before this step") for s in rest)


# -- item: the model's key is never stored in clear -------------------------------------------------


def test_the_models_key_is_masked_everywhere_a_run_is_recorded(
    on: ServicesOn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    svc = on(ANTHROPIC_API_KEY=os.environ["ANTHROPIC_API_KEY"])  # the model stays stub
    big = f"A long answer. {KEY}\n" + "tide " * 20_000  # past the 64 KB blob threshold: S3 on DynamoDB
    ws = write_workspace(
        tmp_path / "ws",
        {
            "leaky": {
                "stub": f"call: lookup {KEY} => found {KEY}\n===\nThe answer is {KEY}.\n"
                f'```json\n{{"token": "{KEY}", "nested": ["x {KEY} y"]}}\n```'
            },
            "reader": {},
            "bigmouth": {"stub": big},
            "breaker": {"stub": f"fail: refused {KEY}"},
            "crasher": {},
        },
        {
            "leak": {
                "input": {"type": "object", "required": ["topic"]},
                "steps": [
                    {"agent": "leaky", "instruction": "Research {input.topic}.", "output": "json"},
                    {"agent": "reader", "instruction": "Read it."},
                    {"agent": "bigmouth"},
                    {"agent": "breaker", "retries": 0, "optional": True},
                    {"agent": "crasher"},
                ],
            }
        },
    )
    checked = check_output  # what the runner calls

    def choke(spec: StepSpec, outcome: StepOutcome) -> Any:  # an unexpected error whose message holds the key (logged, recorded)
        if spec.agent == "crasher":
            raise RuntimeError(f"the parser choked on {KEY}")
        return checked(spec, outcome)

    monkeypatch.setattr(step_module, "check_output", choke)
    caplog.set_level(logging.WARNING)

    run = drive(svc, ws, "leak", {"topic": f"tides {KEY}"})

    assert run.status == RunStatus.failed and f"RuntimeError: the parser choked on {MASK}" in error_of(run)
    leaky, reader, bigmouth, breaker, crasher = run.steps
    assert run.input == {"topic": f"tides {MASK}"} and leaky.instruction == f"Research tides {MASK}."
    assert result_of(leaky).endswith(f'The answer is {MASK}.\n```json\n{{"token": "{MASK}", "nested": ["x {MASK} y"]}}\n```')
    assert leaky.conclusion is not None and MASK in leaky.conclusion and leaky.data == {"token": MASK, "nested": [f"x {MASK} y"]}
    assert leaky.message == f"Research tides {MASK}.\n\nEnd your reply with the result as JSON in a ```json fenced block."
    assert f"The answer is {MASK}." in message_of(reader)
    assert result_of(bigmouth).startswith(f"A long answer. {MASK}")
    assert breaker.error == f"refused {MASK}" and any(MASK in e.text for e in breaker.events)
    assert svc.store.list_attempts(run.tenant, run.id, breaker.index)[0].reason == f"refused {MASK}"
    [tool] = [e for e in leaky.events if e.type == "tool"]
    capture = read_capture(svc, data_of(tool)["capture"])
    assert (capture["input"], capture["output"]) == (MASK, f"found {MASK}")
    ended = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["run_id"] for e in ended] == [run.id] and MASK in ended[0]["error"]
    logged = caplog.text + capfd.readouterr().err
    assert f"the parser choked on {MASK}" in logged

    stored = stored_bytes(on.kind, tmp_path)
    assert KEY.encode() not in stored and MASK.encode() in stored
    assert KEY not in logged


def test_declared_secrets_are_masked_everywhere_a_run_is_recorded_and_dropped_when_it_ends(
    on: ServicesOn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Given three declared secrets (a variable, a file, a model-named one) in a --secrets file
    token, cert, named = "tok-declared-0123456789", "cert-declared-abcdefghij", "sk-ant-declared-for-scripts-42"
    given = tmp_path / "ws" / "given.env"  # the grep of stored bytes leaves the workspace out
    given.parent.mkdir()
    given.write_text(f"TOKEN={token}\nCERT={cert}\nANTHROPIC_API_KEY={named}\n")
    svc = on(LANEFLOW_SECRETS_FILE=str(given))
    log_file = tmp_path / "logs" / "laneflow.log"  # a log kept on disk is grepped too
    log_file.parent.mkdir()
    handler = logging.FileHandler(log_file, encoding="utf-8")
    logging.getLogger().addHandler(handler)
    every = f"{token} {cert} {named}"
    declared = {"secrets": ["TOKEN", "@CERT", "ANTHROPIC_API_KEY"]}
    ws = write_workspace(
        tmp_path / "ws",
        {
            "leaky": {
                **declared,
                "stub": f"call: lookup {every} => found {every}\n===\nThe answer is {every}.\n"
                f'```json\n{{"token": "{token}", "nested": ["x {cert} y"]}}\n```',
            },
            "reader": {},
            "bigmouth": {**declared, "stub": f"A long answer. {every}\n" + "tide " * 20_000},  # an S3 blob on DynamoDB
            "breaker": {**declared, "stub": f"fail: refused {every}"},
            "crasher": {**declared},
        },
        {
            "leak": {
                "steps": [
                    {"agent": "leaky", "instruction": "Research.", "output": "json"},
                    {"agent": "reader", "instruction": "Read it."},
                    {"agent": "bigmouth"},
                    {"agent": "breaker", "retries": 0, "optional": True},
                    {"agent": "crasher"},
                ]
            }
        },
    )
    checked = check_output  # what the runner calls

    def choke(
        spec: StepSpec, outcome: StepOutcome
    ) -> Any:  # an unexpected error whose message holds the values (logged, recorded)
        if spec.agent == "crasher":
            raise RuntimeError(f"the parser choked on {every}")
        return checked(spec, outcome)

    monkeypatch.setattr(step_module, "check_output", choke)
    caplog.set_level(logging.WARNING)

    # When the run is driven to its end
    try:
        run = drive(svc, ws, "leak")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()

    # Then every value is its name wherever the run is recorded
    masked = "[TOKEN] [CERT] [ANTHROPIC_API_KEY]"
    leaky, reader, bigmouth, breaker, crasher = run.steps
    assert leaky.data == {"token": "[TOKEN]", "nested": ["x [CERT] y"]} and f"The answer is {masked}." in result_of(leaky)
    assert f"The answer is {masked}." in message_of(reader)  # the handoff
    assert result_of(bigmouth).startswith(f"A long answer. {masked}")
    assert breaker.error == f"refused {masked}"
    assert run.status == RunStatus.failed and f"the parser choked on {masked}" in error_of(run)
    [tool] = [e for e in leaky.events if e.type == "tool"]
    assert read_capture(svc, data_of(tool)["capture"])["output"] == f"found {masked}"
    ended = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert masked in ended[0]["error"]  # the on-end event
    logged = caplog.text + capfd.readouterr().err + log_file.read_text()
    assert f"the parser choked on {masked}" in logged
    stored = stored_bytes(on.kind, tmp_path)
    for value in (token, cert, named):
        assert value.encode() not in stored and value not in logged
    assert b"[TOKEN]" in stored and b"[CERT]" in stored
    # And the run has ended: no value is held any more
    assert svc.redactor.held() == [] and svc.redactor(every) == every


def test_a_value_added_to_the_stores_redactor_is_masked_in_every_later_write(on: ServicesOn) -> None:
    svc = on()
    run = create_run(svc, SEM, "handoff", {"things": ["tides"]})
    declared = "hunter2-declared-secret"
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(result=f"before {declared}"))
    assert svc.store.get_step(run.tenant, run.id, 0).result == f"before {declared}"  # nothing said it was secret yet
    svc.store.redactor.add("DECLARED", declared)
    svc.store.update_step(run.tenant, run.id, 0, StepChanges(result=f"after {declared}", data={declared: [declared]}))
    svc.store.put_handoff(run.tenant, run.id, "k", f"handed {declared}")
    step = svc.store.get_step(run.tenant, run.id, 0)
    assert (step.result, step.data) == ("after [DECLARED]", {"[DECLARED]": ["[DECLARED]"]})
    assert svc.store.get_handoff(run.tenant, run.id, "k") == "handed [DECLARED]"
    assert svc.redactor.names() == ["DECLARED"]


def test_a_sqlite_database_made_before_messages_were_kept_gets_their_columns_on_open(tmp_path: Path) -> None:
    import sqlite3

    from laneflow.domain.records import AttemptRef

    path = tmp_path / "old.db"
    open_store(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as db:  # as the previous version left it
        db.execute("ALTER TABLE steps DROP COLUMN message")
        db.execute("ALTER TABLE attempts DROP COLUMN reason_kind")
        db.execute("PRAGMA user_version = 4")
    store = open_store(f"sqlite:///{path}")
    svc = for_store(store, Settings(capture_dir=str(tmp_path / "captures")))
    run = create_run(svc, SEM, "handoff", {"things": ["tides"]})
    attempt = store.claim_attempt(run.tenant, run.id, 0, token="t" * 16, started_at=utcnow(), message="Scout tides.")
    store.end_attempt(AttemptRef.of(run.tenant, attempt), AttemptStatus.failed, reason="no", reason_kind=FailureKind.model)
    assert store.get_step(run.tenant, run.id, 0).message == "Scout tides."
    assert store.list_attempts(run.tenant, run.id, 0)[0].reason_kind == FailureKind.model


def test_every_failed_attempt_keeps_its_reason_kind_also_once_moved_off_its_step(on: ServicesOn) -> None:
    from laneflow.domain.records import AttemptRef

    svc = on()
    run = create_run(svc, SEM, "handoff", {"things": ["tides"]})
    kinds = [FailureKind.model, FailureKind.output, FailureKind.worker, FailureKind.other, FailureKind.output]
    for n, kind in enumerate(kinds, 1):  # more attempts than a DynamoDB step item keeps
        attempt = svc.store.claim_attempt(
            run.tenant,
            run.id,
            0,
            token=f"t{n}" * 8,
            started_at=utcnow(),
            expect_status=(StepStatus.pending,),
            message=f"attempt {n}",
        )
        svc.store.end_attempt(
            AttemptRef.of(run.tenant, attempt),
            AttemptStatus.failed,
            reason=f"why {n}",
            reason_kind=kind,
            step=StepChanges(status=StepStatus.pending),
        )
    attempts = svc.store.list_attempts(run.tenant, run.id, 0)
    assert [(a.n, a.reason, a.reason_kind) for a in attempts] == [(n, f"why {n}", k) for n, k in enumerate(kinds, 1)]
    assert svc.store.get_step(run.tenant, run.id, 0).message == "attempt 5"  # the latest attempt's


def test_a_bad_input_quoting_the_models_key_is_refused_without_saying_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from api_calls import RecordingDrives, call

    from laneflow.adapters.local.workspaces import FolderWorkspaces
    from laneflow.settings import settings

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    settings.cache_clear()  # the CLI reads its environment as a process starts
    try:
        code = main(["run", str(SEM), "handoff", "--input", json.dumps({"things": KEY}), "--store", store, "--quiet"])
    finally:
        settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2 and "$.things" in err and f"'{MASK}' is not of type 'array'" in err and KEY not in err
    # The API's 400 says where and what, not the value.
    svc = for_store(open_store(store), Settings(capture_dir=str(tmp_path / "captures"), anthropic_api_key=SecretStr(KEY)))
    svc.workspaces, svc.drives = FolderWorkspaces(FIXTURES), RecordingDrives()
    status, payload, _ = call(svc, "POST", "/runs", {"workspace": "ws_semantics", "flow": "handoff", "input": {"things": KEY}})
    assert status == 400 and "$.things" in json.dumps(payload) and KEY not in json.dumps(payload)
    assert MASK in json.dumps(payload)
