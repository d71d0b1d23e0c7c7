"""A tenant name no key can hold (`#`, `/`, a control character, empty, too long) is refused
with a clear error at the stores' entry points, on SQLite and on DynamoDB (moto), and by the
CLI for LANEFLOW_TENANT, before anything is written. (The API's 400 on every route is in
test_tenant_isolation.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract.store.backends import BACKENDS

from laneflow.adapters.store import Store
from laneflow.domain.records import Run, RunChanges, RunStatus, Step
from laneflow.domain.tenants import TenantInvalid
from laneflow.entrypoints import cli
from laneflow.settings import settings

BAD = ["acme#RUNS", "", "line\nbreak", "acme/../globex", "t" * 65]


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Store]:
    with BACKENDS[store_kind](tmp_path) as s:
        yield s


def a_run(tenant: str) -> Run:
    return Run(id="run-t", tenant=tenant, workspace="desk", flow="notes", steps=[Step(index=0, group=0, agent="clerk")])


@pytest.mark.parametrize("tenant", BAD, ids=["hash", "empty", "control", "slash", "long"])
def test_a_bad_tenant_is_refused_by_the_stores_entry_points_naming_it_and_nothing_is_written(store: Store, tenant: Any) -> None:
    with pytest.raises(TenantInvalid) as refused:
        store.create_run(a_run(tenant))
    assert (repr(tenant[:40])[:-1] in str(refused.value)) if tenant else "empty" in str(refused.value)
    assert store.active_runs() == []  # no tenant's runs at all: nothing was written
    for entry in (
        lambda: store.get_run(tenant, "run-t"),
        lambda: store.list_runs(tenant),
        lambda: store.request_stop(tenant, "run-t"),
        lambda: store.update_run(tenant, "run-t", RunChanges(status=RunStatus.running)),
    ):
        with pytest.raises(TenantInvalid):
            entry()


def test_a_tenant_that_only_prefixes_another_reads_nothing_of_it(store: Store) -> None:
    store.create_run(a_run("acme"))
    assert [r.id for r in store.list_runs("acme")] == ["run-t"]
    assert store.list_runs("acm") == [] and store.list_runs("acme.eu") == []


def test_a_bad_LANEFLOW_TENANT_is_a_clear_cli_error_with_exit_2_and_makes_no_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LANEFLOW_TENANT", "acme#RUNS")
    settings.cache_clear()
    try:
        code = cli.main(["runs"])
    finally:
        settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("laneflow: LANEFLOW_TENANT 'acme#RUNS' cannot contain '#'") and "Traceback" not in err
    assert os.listdir(tmp_path) == []  # no .laneflow store was made for it
