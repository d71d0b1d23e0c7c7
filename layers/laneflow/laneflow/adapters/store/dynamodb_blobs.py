"""Where the DynamoDB store's large values go: S3, under keys of their own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from laneflow.adapters.store.dynamodb_expr import Update
from laneflow.adapters.store.dynamodb_items import BLOBBABLE, ITEM_LIMIT, attr_field, av_size, to_av
from laneflow.domain.errors import InvalidInput

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


class ItemTooLarge(InvalidInput):
    """A value too large to keep in a DynamoDB item, and no blob bucket to put it in."""


def too_large(message: str, bucket: str | None) -> ItemTooLarge:
    if bucket:
        return ItemTooLarge(f"an item would pass DynamoDB's 400 KB even with its large values in s3://{bucket}: {message}")
    return ItemTooLarge(
        f"a value is too large for a DynamoDB item (at most 400 KB) and no blob bucket is configured"
        f" (use dynamodb://TABLE?bucket=BUCKET): {message}"
    )


class Blobs:
    """One write's large values: over the threshold (or to keep an item under ~350 KB) they
    go to S3 under a key of their own; `undo` deletes what a failed write uploaded."""

    def __init__(self, s3: S3Client, bucket: str | None, threshold: int, tenant: str, run_id: str) -> None:
        self.s3, self.bucket, self.threshold = s3, bucket, threshold
        self.prefix = f"{tenant}/{run_id}/"
        self.uploaded: list[str] = []

    def item(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """A whole item (plain values, `sk` included) with its large values moved out."""
        return {**attrs, **self.attrs(attrs["sk"], {k: v for k, v in attrs.items() if k not in ("pk", "sk")})}

    def attrs(self, sk: str, attrs: dict[str, Any]) -> dict[str, Any]:
        """Plain attribute values of one item, its large ones replaced by S3 pointers."""
        sizes = {k: len(v.encode()) for k, v in attrs.items() if k in BLOBBABLE and isinstance(v, str)}
        total = sum(len(k) + (sizes.get(k) or av_size(to_av(v))) for k, v in attrs.items() if v is not None)
        moving = [k for k, size in sizes.items() if size > self.threshold]
        if self.bucket is None:
            if total > ITEM_LIMIT:
                largest = max(sizes, key=sizes.__getitem__) if sizes else "?"
                field = attr_field(sk, largest)
                raise too_large(f"{field} of {sk} is {sizes.get(largest, total):,} bytes, and the item {total:,}", None)
            return attrs
        remaining = total - sum(sizes[k] for k in moving)
        for k in sorted(sizes, key=sizes.__getitem__, reverse=True):
            if remaining <= ITEM_LIMIT:
                break
            if k not in moving:
                moving.append(k)
                remaining -= sizes[k]
        out = dict(attrs)
        for k in moving:
            out[k] = {"s3": self._upload(sk, k, attrs[k])}
        return out

    def squeeze(self, sk: str, u: Update) -> bool:
        """Move every value over 1 KB that `u` sets to S3 (the item it updates would pass
        400 KB with what it already holds). False if there is nowhere to move them, or none."""
        if self.bucket is None:
            return False
        moved = False
        for alias, name in u.assigned.items():
            value = u.values[alias]
            if name in BLOBBABLE and "S" in value and len(value["S"].encode()) > 1024:
                u.values[alias] = to_av({"s3": self._upload(sk, name, value["S"])})
                moved = True
        return moved

    def _upload(self, sk: str, attr: str, text: str) -> str:
        assert self.bucket is not None, "a value moves to S3 only when there is a bucket"
        key = f"{self.prefix}{sk.replace('#', '/')}/{attr_field(sk, attr)}-{uuid.uuid4().hex}"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=text.encode("utf-8"), ContentType="text/plain; charset=utf-8")
        self.uploaded.append(key)
        return f"s3://{self.bucket}/{key}"

    def undo(self) -> None:
        if self.bucket is None:
            return
        for key in self.uploaded:
            try:
                self.s3.delete_object(Bucket=self.bucket, Key=key)
            except ClientError:  # pragma: no cover - best effort: an orphan blob harms nothing
                pass


@contextmanager
def blobs_of(s3: S3Client, bucket: str | None, threshold: int, tenant: str, run_id: str) -> Iterator[Blobs]:
    """Where one write's large values go; what it uploaded is deleted if it fails."""
    blobs = Blobs(s3, bucket, threshold, tenant, run_id)
    try:
        yield blobs
    except BaseException:
        blobs.undo()
        raise
