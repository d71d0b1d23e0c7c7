"""The API's schedules on both stores: add (every bad field a 400 naming it, nothing kept),
list with next firings, read, pause, resume, remove, the runs a schedule started
(`GET /runs?schedule=ID`), and every route scoped to the caller's tenant: another
tenant's schedule is answered exactly like a missing one."""

from __future__ import annotations

from typing import Any

import pytest
from api_calls import call, problem_fields
from helpers import FIXTURES, ServicesOn

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.ports import Services
from laneflow.usecases.fire_schedule import fire

BODY = {"workspace": "ws_control", "flow": "approval", "expression": "cron(0 7 ? * MON-FRI *)", "timezone": "Europe/Berlin"}


class Drives:
    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def start(self, tenant: str, run_id: str) -> str:
        self.started.append((tenant, run_id))
        return "drive"


@pytest.fixture
def api(on: ServicesOn) -> Services:
    svc = on()
    svc.workspaces = FolderWorkspaces(FIXTURES)
    svc.drives = Drives()
    return svc


def add(api: Services, body: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    status, schedule, headers = call(api, "POST", "/schedules", body or BODY, **kwargs)
    assert status == 201, schedule
    assert headers["location"] == [f"/Prod/schedules/{schedule['id']}"]
    return schedule  # type: ignore[no-any-return]


def test_a_schedule_added_is_listed_and_read_with_its_next_firings_on_its_zones_clock(api: Services) -> None:
    made = add(api)
    assert made["state"] == "enabled" and made["overlap"] == "skip" and made["tenant"] == "acme"
    assert len(made["next"]) == 3 and all(n.endswith(("+01:00", "+02:00")) and "T07:00:00" in n for n in made["next"])
    assert "workspace_uri" not in made  # where the workspace is stays here
    status, listed, _ = call(api, "GET", "/schedules")
    assert status == 200 and [s["id"] for s in listed["schedules"]] == [made["id"]]
    status, got, _ = call(api, "GET", f"/schedules/{made['id']}")
    assert status == 200 and got["expression"] == BODY["expression"] and got["firings"] == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"expression": "cron(0 7 * * * *)"}, "expression"),
        ({"expression": "rate(5 weeks)"}, "expression"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"flow": "no-such-flow"}, "flow"),
        ({"workspace": "ws_ok", "flow": "brief", "input": {"topics": 3}}, "input"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"extra": 1}, "extra"),
        ({"input": "not an object"}, "input"),
    ],
)
def test_each_bad_field_is_a_400_naming_it_and_nothing_is_kept(api: Services, change: dict[str, Any], field: str) -> None:
    status, payload, _ = call(api, "POST", "/schedules", {**BODY, **change})
    assert status == 400, payload
    assert field in problem_fields(payload), payload
    assert api.store.list_schedules("acme") == []


def test_an_unknown_workspace_is_a_404(api: Services) -> None:
    status, payload, _ = call(api, "POST", "/schedules", {**BODY, "workspace": "nowhere"})
    assert status == 404 and "nowhere" in payload["message"]


def test_pause_resume_and_remove_change_the_schedule(api: Services) -> None:
    made = add(api)
    status, paused, _ = call(api, "POST", f"/schedules/{made['id']}/pause")
    assert status == 200 and paused["state"] == "paused" and paused["next"] == []
    status, resumed, _ = call(api, "POST", f"/schedules/{made['id']}/resume", {})
    assert status == 200 and resumed["state"] == "enabled" and len(resumed["next"]) == 3
    status, payload, _ = call(api, "POST", f"/schedules/{made['id']}/pause", {"why": "x"})
    assert status == 400 and problem_fields(payload) == {"why"}
    status, removed, _ = call(api, "DELETE", f"/schedules/{made['id']}")
    assert status == 200 and removed["id"] == made["id"]
    assert call(api, "GET", f"/schedules/{made['id']}")[0] == 404
    assert call(api, "DELETE", f"/schedules/{made['id']}")[0] == 404


def test_the_runs_a_schedule_started_are_listed_under_it(api: Services) -> None:
    made = add(api, {**BODY, "overlap": "allow"})
    ids = [fire(api, "acme", made["id"], f"2026-03-0{d}T06:00:00Z").firing.run_id for d in (2, 3, 4)]
    status, page, _ = call(api, "GET", "/runs", query={"schedule": made["id"], "limit": "2"})
    assert status == 200 and [r["id"] for r in page["runs"]] == ids[::-1][:2] and page["next"] == ids[1]
    assert all(r["schedule_id"] == made["id"] for r in page["runs"])
    assert page["runs"][0]["scheduled_at"] == "2026-03-04T06:00:00Z"
    status, rest, _ = call(api, "GET", "/runs", query={"schedule": made["id"], "before": page["next"]})
    assert status == 200 and [r["id"] for r in rest["runs"]] == [ids[0]] and rest["next"] is None
    status, run, _ = call(api, "GET", f"/runs/{ids[0]}")
    assert status == 200 and (run["schedule_id"], run["scheduled_at"]) == (made["id"], "2026-03-02T06:00:00Z")
    status, got, _ = call(api, "GET", f"/schedules/{made['id']}")
    assert [f["run_id"] for f in got["firings"]] == ids[::-1] and got["last_run"] == ids[2]


@pytest.mark.parametrize(
    ("method", "path", "body", "query"),
    [
        ("GET", "/schedules/{id}", None, None),
        ("DELETE", "/schedules/{id}", None, None),
        ("POST", "/schedules/{id}/pause", None, None),
        ("POST", "/schedules/{id}/resume", None, None),
        ("GET", "/runs", None, {"schedule": "{id}"}),
    ],
)
def test_another_tenants_schedule_is_answered_like_a_missing_one_on_every_route(
    api: Services, method: str, path: str, body: Any, query: dict[str, str] | None
) -> None:
    theirs = add(api, tenant="globex")
    fire(api, "globex", theirs["id"], "2026-03-02T06:00:00Z")
    where = path.replace("{id}", theirs["id"])
    asked = {k: v.replace("{id}", theirs["id"]) for k, v in query.items()} if query else None
    status, payload, _ = call(api, method, where, body, query=asked)  # as acme
    missing = path.replace("{id}", "sch-00000000deadbeef")
    asked_missing = {k: v.replace("{id}", "sch-00000000deadbeef") for k, v in query.items()} if query else None
    status_missing, payload_missing, _ = call(api, method, missing, body, query=asked_missing)
    assert (status, status_missing) == (404, 404)
    assert payload["message"].replace(theirs["id"], "X") == payload_missing["message"].replace("sch-00000000deadbeef", "X")
    assert call(api, "GET", "/schedules")[1] == {"schedules": []}  # acme lists none of globex's
    # ...and nothing of globex's changed.
    status, kept, _ = call(api, "GET", f"/schedules/{theirs['id']}", tenant="globex")
    assert status == 200 and kept["state"] == "enabled" and len(kept["firings"]) == 1


def test_a_schedule_added_by_one_tenant_is_its_own(api: Services) -> None:
    add(api, tenant="globex")
    add(api)
    status, acme, _ = call(api, "GET", "/schedules")
    status_g, globex, _ = call(api, "GET", "/schedules", tenant="globex")
    assert status == status_g == 200
    assert [s["tenant"] for s in acme["schedules"]] == ["acme"] and [s["tenant"] for s in globex["schedules"]] == ["globex"]
    assert call(api, "GET", "/schedules", tenant=None)[0] == 401
