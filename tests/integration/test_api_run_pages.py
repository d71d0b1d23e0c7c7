"""The run list as an operator's console reads it (`GET /runs`): page after page by `before`,
filtered by status (`stopped` among them) and searched; and the reason a person gives for a
stop or a rejection, kept in the run's error and its trace."""

from __future__ import annotations

import pytest
from api_calls import api_services, call, problem_fields, start
from helpers import FIXTURES

from laneflow.domain.messages import DriveRef, EndRunRequest
from laneflow.domain.records import RunChanges, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.usecases import list_runs
from laneflow.usecases.end_run import end_run
from laneflow.usecases.start_run import prepare_run
from laneflow.usecases.stop import stop_run
from laneflow.wiring import local_engine


@pytest.fixture
def api_svc(svc: Services) -> Services:
    return api_services(svc)


def ids(payload: dict[str, object]) -> list[str]:
    runs = payload["runs"]
    assert isinstance(runs, list)
    return [r["id"] for r in runs]


def every_page(svc: Services, query: dict[str, str]) -> list[list[str]]:
    pages, before = [], None
    while True:
        status, payload, _ = call(svc, "GET", "/runs", query={**query, **({"before": before} if before else {})})
        assert status == 200, payload
        pages.append(ids(payload))
        before = payload["next"]
        if before is None:
            return pages
        assert payload["runs"] and before == payload["runs"][-1]["id"]  # a page's next is its last run


def test_pages_by_before_give_every_run_once_newest_first_and_the_last_says_no_next(api_svc: Services) -> None:
    made = [start(api_svc)["id"] for _ in range(5)]

    pages = every_page(api_svc, {"limit": "2"})

    assert pages == [made[4:2:-1], made[2:0:-1], made[:1]]
    status, payload, _ = call(api_svc, "GET", "/runs", query={"limit": "5"})
    assert ids(payload) == made[::-1] and payload["next"] is None  # exactly a page: no next


def _failed(svc: Services, run_id: str, error: str) -> None:
    svc.store.update_run("acme", run_id, RunChanges(status=RunStatus.failed, error=error, finished_at="2026-01-01T00:00:00Z"))


def test_status_filters_tell_a_stopped_run_from_a_failed_one_and_search_reads_id_flow_status_and_error(
    api_svc: Services,
) -> None:
    # Given a queued run, one failed for a quota, one stopped by a person, one completed,
    queued, quota, stopped, done = (start(api_svc)["id"] for _ in range(4))
    _failed(api_svc, quota, "the model's quota was spent")
    assert call(api_svc, "POST", f"/runs/{stopped}/stop", {"reason": "wrong input"})[0] == 200
    api_svc.store.update_run("acme", done, RunChanges(status=RunStatus.completed))

    def listed(**query: str) -> list[str]:
        status, payload, _ = call(api_svc, "GET", "/runs", query=query)
        assert status == 200, payload
        return ids(payload)

    # Then each filter lists its own: a stopped run is not among the failed, and the reverse,
    assert listed(status="stopped") == [stopped]
    assert listed(status="failed") == [quota]
    assert listed(status="failed,stopped") == [stopped, quota]
    assert listed(status="queued,running,awaiting-approval") == [queued]
    assert listed(status="completed") == [done]
    # and a search finds by the error's words, the person's reason, the flow, the id, the shown status.
    assert listed(q="QUOTA") == [quota]
    assert listed(q="wrong input") == [stopped]
    assert listed(q="ws_control/approval") == [done, stopped, quota, queued]
    assert listed(q=queued[-8:]) == [queued]
    assert listed(q="stopped") == [stopped]
    assert listed(q="quota", status="stopped") == []
    assert listed(q="nothing-has-this") == []


def test_a_search_reads_a_bounded_number_of_runs_per_page_and_says_where_to_go_on(
    api_svc: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given six runs of which only the oldest holds the word, and a search that reads at most four per page,
    oldest, *rest = [start(api_svc)["id"] for _ in range(6)]
    _failed(api_svc, oldest, "needle in the error")
    monkeypatch.setattr(list_runs, "SEARCHED_AT_MOST", 4)
    monkeypatch.setattr(list_runs, "BATCH", 3)

    # When it is searched, the first page is empty but says where it stopped reading,
    status, first, _ = call(api_svc, "GET", "/runs", query={"q": "needle"})
    assert status == 200 and first["runs"] == [] and first["searched"] == 4
    assert first["next"] == rest[-4]

    # and going on from there finds it, and says there is nothing older.
    status, second, _ = call(api_svc, "GET", "/runs", query={"q": "needle", "before": first["next"]})
    assert ids(second) == [oldest] and second["next"] is None and second["searched"] == 2


def test_a_bad_status_is_a_400_naming_it_and_a_page_after_a_run_that_is_not_there_a_404(api_svc: Services) -> None:
    start(api_svc)
    for bad in ("finished", "failed,", "failed;stopped"):
        status, payload, _ = call(api_svc, "GET", "/runs", query={"status": bad})
        assert status == 400 and problem_fields(payload) == {"status"}, (bad, payload)
    status, payload, _ = call(api_svc, "GET", "/runs", query={"before": "run-nope"})
    assert status == 404 and "run-nope" in payload["message"]
    # another tenant's run is no place to list after
    theirs = start(api_svc, tenant="globex")["id"]
    assert call(api_svc, "GET", "/runs", query={"before": theirs})[0] == 404


# -- reasons -----------------------------------------------------------------------------------


def test_a_stop_with_a_reason_keeps_it_in_the_runs_error_and_a_stop_without_one_says_the_usual(api_svc: Services) -> None:
    with_reason, without, blank = (start(api_svc)["id"] for _ in range(3))

    status, payload, _ = call(api_svc, "POST", f"/runs/{with_reason}/stop", {"reason": "  wrong\ninput  "})
    assert status == 200 and payload["run"]["error"] == "stopped by a person: wrong input"
    assert call(api_svc, "POST", f"/runs/{without}/stop", {})[1]["run"]["error"] == "stopped by a person"
    assert call(api_svc, "POST", f"/runs/{blank}/stop", {"reason": "   "})[1]["run"]["error"] == "stopped by a person"
    # a second stop's reason does not replace the first's
    call(api_svc, "POST", f"/runs/{with_reason}/stop", {"reason": "another"})
    assert api_svc.store.get_run("acme", with_reason, steps=False).error == "stopped by a person: wrong input"


def test_a_stop_or_approval_reason_that_does_not_fit_is_a_400_naming_it_and_stops_nothing(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]
    for path, body, field in (
        ("stop", {"reason": 5}, "reason"),
        ("stop", {"reason": "x" * 501}, "reason"),
        ("stop", {"why": "x"}, "why"),
        ("approval", {"approve": False, "reason": ["no"]}, "reason"),
    ):
        status, payload, _ = call(api_svc, "POST", f"/runs/{run_id}/{path}", body)
        assert status == 400 and problem_fields(payload) == {field}, (body, payload)
    run = api_svc.store.get_run("acme", run_id, steps=False)
    assert run.status == RunStatus.queued and not run.stop_requested


def test_a_running_runs_stop_reason_is_the_error_its_end_keeps(api_svc: Services) -> None:
    run_id = start(api_svc)["id"]
    api_svc.store.update_run("acme", run_id, RunChanges(status=RunStatus.running))

    outcome = stop_run(api_svc, "acme", run_id, reason="over budget")
    assert outcome.run.status == RunStatus.running and outcome.run.error == "stopped by a person: over budget"

    end_run(api_svc, EndRunRequest(run=DriveRef(tenant="acme", run_id=run_id)))  # as its drive ends it
    ended = api_svc.store.get_run("acme", run_id)
    assert ended.status == RunStatus.failed and ended.error == "stopped by a person: over budget"
    assert {s.skip_reason for s in ended.steps} == {"run stopped"}


def _parked_run(svc: Services) -> str:
    run = prepare_run(svc, FIXTURES / "ws_control", "approval", tenant="acme")
    svc.store.create_run(run)
    assert local_engine(svc).drive("acme", run.id, tick_s=0.02).run.status == RunStatus.awaiting_approval
    return run.id


def test_a_rejection_with_a_reason_says_it_in_the_runs_error_the_steps_error_and_trace(api_svc: Services) -> None:
    run_id = _parked_run(api_svc)

    status, run, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": False, "reason": "not this week"})

    assert status == 200 and run["status"] == "failed" and run["error"] == "rejected by a person: not this week"
    final = api_svc.store.get_run("acme", run_id)
    approval, poster = final.steps[1], final.steps[2]
    assert approval.status == StepStatus.failed and approval.error == "rejected by a person: not this week"
    assert "rejected by a person: not this week" in [e.text for e in approval.events]
    # the steps after it are skipped for the rejection, as without a reason
    assert (poster.status, poster.skip_reason) == (StepStatus.skipped, "rejected by a person")


def test_an_approval_with_a_reason_says_it_in_the_approval_steps_trace(api_svc: Services) -> None:
    run_id = _parked_run(api_svc)

    status, run, _ = call(api_svc, "POST", f"/runs/{run_id}/approval", {"approve": True, "reason": "checked the figures"})

    assert status == 200 and run["status"] == "queued"
    approval = api_svc.store.get_run("acme", run_id).steps[1]
    assert approval.status == StepStatus.completed and approval.result == "approved by a person"
    assert "approved by a person: checked the figures" in [e.text for e in approval.events]
