"""Where runs are kept: `open_store(url)` picks the implementation of `Store` a URL names."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlsplit

from laneflow.adapters.store.sqlite import SqliteStore
from laneflow.domain.errors import InvalidInput
from laneflow.ports import Store

__all__ = ["SqliteStore", "Store", "open_store"]


_SQLITE = "sqlite:///"

_DYNAMODB = "dynamodb://"

_FORMS = (
    "sqlite:///PATH (e.g. sqlite:///.laneflow/laneflow.db, sqlite:////abs/path.db)"
    " or dynamodb://TABLE (optionally dynamodb://TABLE?bucket=BUCKET&region=REGION)"
)

_DYNAMODB_OPTIONS = ("bucket", "region")


def open_store(url: str | None = None, *, default_dir: str | os.PathLike[str] = ".laneflow") -> Store:
    """Open the store a URL names.

    - `sqlite:///PATH`: the embedded store in one file. PATH is everything after the third
      slash, so `sqlite:///runs.db` is relative to the current directory and
      `sqlite:////var/laneflow.db` is absolute; `sqlite:///:memory:` is a private in-memory
      database (for tests). The file's folder is created if missing.
    - None: `sqlite:///<default_dir>/laneflow.db`, relative to the current directory.
    - `dynamodb://TABLE`, `dynamodb://TABLE?bucket=BUCKET&region=REGION`: the DynamoDB store
      (large values go to the S3 bucket). Credentials, region and endpoints come from boto3's
      usual configuration (AWS_REGION, AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_DYNAMODB,
      AWS_ENDPOINT_URL_S3, ...); `region` overrides the region.

    Anything else is `InvalidInput`.
    """
    if url is None:
        os.makedirs(default_dir, exist_ok=True)
        return SqliteStore(os.path.join(default_dir, "laneflow.db"))
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE) :]
        if not path:
            raise InvalidInput(f"store URL {url!r} names no file; use {_FORMS}")
        if path != ":memory:":
            folder = os.path.dirname(os.path.expanduser(path))
            if folder:
                os.makedirs(folder, exist_ok=True)
        return SqliteStore(path)
    if url.startswith(_DYNAMODB):
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(options) - set(_DYNAMODB_OPTIONS))
        if not parts.netloc or parts.path or unknown:
            raise InvalidInput(f"store URL {url!r} is not a DynamoDB table URL; use {_FORMS}")
        from laneflow.adapters.store.dynamodb import (
            DynamoStore,  # boto3 is only imported by whoever uses DynamoDB
        )

        return DynamoStore(parts.netloc, bucket=options.get("bucket") or None, region=options.get("region") or None)
    raise InvalidInput(f"unknown store URL {url!r}; use {_FORMS}")
