"""What the driver must know about a batch before it writes, in one small aggregate (one Spark job).

Per table: how many changes, deletes that are not yet tombstoned, primary-key moves that need the old
key's row, the newest truncate, the column and key names the changes carry, and any extra aggregate a
caller asks for (the key range the MERGE prunes files with, the newest event time of a window view).
The old sink asked these questions with a job each (isEmpty, count, collect per table); here they are
one grouped aggregate whose result is a row per table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from spark_jobs.sinks.delta._version import Version, newer_or_absent

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Facts:
    rows: int = 0  # changes to rows (not truncates)
    fresh_deletes: int = 0  # deletes above their row's tombstone: to record
    moved_deletes: int = 0  # of those, the deletes of a primary-key change: their image is kept
    moved_fills: int = 0  # creates of a primary-key change with unchanged-TOAST columns to fill
    truncate: tuple[int, int] | None = None  # the batch's newest truncate of the table
    columns: tuple[str, ...] = ()
    keys: tuple[tuple[str, ...], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


_TOMB = Version.field("tomb")
_CHANGE = Version.field("version")


def collect_facts(guarded: DataFrame, extra: dict[str, Column] | None = None) -> dict[str, Facts]:
    """`guarded`: CHANGE rows with `tomb` (the row's newest tombstone, or NULL). `extra`: name → an
    aggregate expression, computed per table."""
    extra = extra or {}
    op = F.col("op")
    fresh_delete = (op == "d") & F.expr(newer_or_absent(_CHANGE, _TOMB))
    fill = F.col("after").isNotNull() & F.col("old_row_id").isNotNull() & (F.size("unavailable") > 0)
    found = guarded.groupBy("table").agg(
        F.count(F.when(op != "t", True)).alias("rows"),
        F.count(F.when(fresh_delete, True)).alias("fresh_deletes"),
        F.count(F.when(fresh_delete & F.col("moved"), True)).alias("moved_deletes"),
        F.count(F.when(fill, True)).alias("moved_fills"),
        F.max(F.when(op == "t", F.col("version"))).alias("truncate"),
        F.array_distinct(F.flatten(F.collect_set(F.map_keys("after")))).alias("columns"),
        F.collect_set(F.map_keys("key")).alias("keys"),
        *(expression.alias(f"x_{name}") for name, expression in extra.items()),
    ).collect()
    return {
        row["table"]: Facts(
            rows=row["rows"], fresh_deletes=row["fresh_deletes"], moved_deletes=row["moved_deletes"],
            moved_fills=row["moved_fills"],
            truncate=(row["truncate"]["major"], row["truncate"]["minor"]) if row["truncate"] else None,
            columns=tuple(row["columns"] or ()), keys=tuple(tuple(k) for k in row["keys"] or ()),
            extra={name: row[f"x_{name}"] for name in extra},
        )
        for row in found
    }


__all__ = ["Facts", "collect_facts"]
