"""Creating a store's table (and blob bucket) from template.yaml's own RunsTable, for a
local DynamoDB endpoint or a test: the table can never drift from what `sam deploy` makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from laneflow.adapters.engine.template import Template
from laneflow.domain.errors import InvalidInput
from laneflow.paths import project_root


def table_spec(template: Path | None = None) -> dict[str, Any]:
    """create_table arguments from the template's RunsTable (without its name)."""
    props = Template.load(template or project_root() / "template.yaml").resources["RunsTable"]["Properties"]
    spec: dict[str, Any] = {
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
    }
    if props.get("GlobalSecondaryIndexes"):
        spec["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
    return spec


def init_store(url: str, *, template: Path | None = None) -> list[str]:
    """Create what a `dynamodb://TABLE[?bucket=B&region=R]` store needs, if missing.
    Returns what it did, one line each. SQLite stores need nothing."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        return ["sqlite stores create their tables on first use"]
    if parsed.scheme != "dynamodb" or not parsed.netloc:
        raise InvalidInput(f"--store {url!r}: init-store takes dynamodb://TABLE[?bucket=NAME&region=R]")
    import boto3

    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    region = query.get("region")
    dynamodb = boto3.client("dynamodb", region_name=region)
    table, done = parsed.netloc, []
    if table in dynamodb.list_tables().get("TableNames", []):
        done.append(f"table {table} exists")
    else:
        dynamodb.create_table(TableName=table, **table_spec(template))
        dynamodb.get_waiter("table_exists").wait(TableName=table)
        ttl = (
            Template.load(template or project_root() / "template.yaml")
            .resources["RunsTable"]["Properties"]
            .get("TimeToLiveSpecification")
        )
        if ttl:
            dynamodb.update_time_to_live(TableName=table, TimeToLiveSpecification=ttl)
        done.append(f"table {table} created from template.yaml's RunsTable")
    bucket = query.get("bucket")
    if bucket:
        s3 = boto3.client("s3", region_name=region)
        existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        if bucket in existing:
            done.append(f"bucket {bucket} exists")
        else:
            args: dict[str, Any] = {"Bucket": bucket}
            if region and region != "us-east-1":
                args["CreateBucketConfiguration"] = {"LocationConstraint": region}
            s3.create_bucket(**args)
            done.append(f"bucket {bucket} created")
    return done
