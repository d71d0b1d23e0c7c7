"""open_store: the URL forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.store.backends import BUCKET, REGION, TABLE, TENANT, new_run
from laneflow.adapters.store import open_store
from laneflow.adapters.store.dynamodb import DynamoStore
from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.errors import InvalidInput


def test_open_store_without_a_url_uses_laneflow_db_under_the_default_dir_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store()
    try:
        assert isinstance(store, SqliteStore)
        assert (tmp_path / ".laneflow" / "laneflow.db").is_file()
        assert store.url == f"sqlite:///{tmp_path / '.laneflow' / 'laneflow.db'}"
    finally:
        store.close()


def test_open_store_takes_relative_absolute_and_memory_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url, file in (
        ("sqlite:///data/runs.db", tmp_path / "data" / "runs.db"),
        (f"sqlite:///{tmp_path / 'abs.db'}", tmp_path / "abs.db"),
    ):
        store = open_store(url)
        new_run(store, id="run-1")
        store.close()
        assert file.is_file()
        reopened = open_store(url)
        assert reopened.get_run(TENANT, "run-1").id == "run-1"
        reopened.close()
    memory = open_store("sqlite:///:memory:")
    new_run(memory, id="run-mem")
    assert memory.get_run(TENANT, "run-mem").id == "run-mem"
    memory.close()


def test_open_store_opens_a_dynamodb_table_with_boto3s_own_configuration(dynamo: DynamoStore) -> None:
    # The region comes from the environment as boto3 reads it; the URL's region overrides it.
    plain = open_store(f"dynamodb://{TABLE}")
    assert isinstance(plain, DynamoStore)
    assert (plain.table, plain.bucket, plain.region) == (TABLE, None, REGION)
    new_run(plain, id="run-plain")
    assert dynamo.get_run(TENANT, "run-plain").id == "run-plain"
    named = open_store(f"dynamodb://{TABLE}?bucket={BUCKET}&region=eu-west-1")
    assert (named.bucket, named.region) == (BUCKET, "eu-west-1")  # type: ignore[attr-defined]
    assert named.url == f"dynamodb://{TABLE}?bucket={BUCKET}&region=eu-west-1"


@pytest.mark.parametrize(
    "url", ["dynamodb://", "dynamodb://t/extra", "dynamodb://t?colour=red", "dynamodb://t?bucket=b&endpoint=http://x"]
)
def test_open_store_refuses_a_malformed_dynamodb_url_naming_the_accepted_forms(url: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        open_store(url)
    assert repr(url) in str(refused.value) and "dynamodb://TABLE?bucket=BUCKET&region=REGION" in str(refused.value)


@pytest.mark.parametrize("url", ["postgres://db/runs", "sqlite://relative.db", "sqlite:///", "runs.db", ""])
def test_open_store_refuses_other_urls_naming_the_url_and_the_accepted_forms(url: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        open_store(url)
    assert repr(url) in str(refused.value)
    assert "sqlite:///PATH" in str(refused.value) and "dynamodb://TABLE" in str(refused.value)
