"""Shared by the Delta sink tests: the demo catalogue plus a table of every source type, micro-batches as the
pipeline hands them to a sink, and CHANGE rows (tests/unit/spark_frames.change) for products, orders, truncates."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from spark_jobs.changes.newest import newest_per_row
from spark_jobs.model.catalogue import Catalogue, Column, TableSchema
from spark_jobs.sinks.base import Batch
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

KINDS = TableSchema({name: Column(name, kind, precision, scale) for name, kind, precision, scale in (
    ("id", "INT4", None, None), ("small", "INT2", None, None), ("ratio", "FLOAT4", None, None),
    ("score", "FLOAT8", None, None), ("flag", "BOOL", None, None), ("local_at", "TIMESTAMP", None, None),
    ("day", "DATE", None, None), ("raw", "BYTEA", None, None), ("uid", "UUID", None, None),
    ("status", "ORDER_STATUS", None, None), ("huge", "NUMERIC", None, None), ("amounts", "_NUMERIC", 10, 2),
    ("doc", "JSONB", None, None), ("code", "BPCHAR", 2, None),
)}, ("id",))
MEMBERS: Catalogue = {**demo_catalogue(), "kinds": KINDS}


def batch(spark, changes: list[dict], batch_id: int = 0, catalogue: Catalogue = MEMBERS) -> Batch:
    """A micro-batch as the pipeline hands it to a sink: every change, and the newest per row."""
    every = frame(spark, changes)
    return Batch(batch_id, spark, newest_per_row(every), every, catalogue)


def write(spark, sink, changes: list[dict], batch_id: int = 0, catalogue: Catalogue = MEMBERS) -> list[dict]:
    """Run the sink's write and its returned rejects (the pipeline's dead-letter action)."""
    rejected = sink.write(batch(spark, changes, batch_id, catalogue))
    return [] if rejected is None else [row.asDict(recursive=True) for row in rejected.collect()]


def versions(spark, *paths: str) -> list[int]:
    from delta.tables import DeltaTable

    return [DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] for path in paths]


def product(version, key=1, op="u", unavailable=(), **values: Any) -> dict:
    after = None
    if op != "d":
        after = {"id": str(key), "name": f"v{version}", "description": f"text {version}", "price": "1.00",
                 "tags": '["a"]', "attributes": json.dumps({"v": list(version)}),
                 "updated_at": "2026-03-29T01:30:15.123456Z",
                 **values}
        after = {column: value for column, value in after.items() if column not in unavailable}
    return change(version, op, "products", key, after, tuple(unavailable))


def truncate(version, table="order_items") -> dict:
    return change(version, "t", table)


def order(version, key, total, created: datetime | None, op="u") -> dict:
    after = None if op == "d" else {"id": str(key), "total": total,
                                    "created_at": None if created is None
                                    else created.isoformat().replace("+00:00", "Z")}
    return change(version, op, "orders", key, after)
