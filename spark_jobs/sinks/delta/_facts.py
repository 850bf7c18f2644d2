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

    from spark_jobs.model.catalogue import Catalogue

_INTEGER_KEYS = ("INT2", "INT4", "INT8")


@dataclass(frozen=True)
class Facts:
    rows: int = 0  # changes to rows (not truncates)
    fresh_deletes: int = 0  # deletes above their row's tombstone: to record
    moved_deletes: int = 0  # of those, the deletes of a primary-key change: their image is kept
    moved_fills: int = 0  # creates of a primary-key change with unchanged-TOAST columns to fill
    not_inserts: int = 0  # updates and deletes (neither a snapshot read nor an insert)
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
        F.count(F.when(~op.isin("r", "c", "t"), True)).alias("not_inserts"),
        F.max(F.when(op == "t", F.col("version"))).alias("truncate"),
        F.array_distinct(F.flatten(F.collect_set(F.map_keys("after")))).alias("columns"),
        F.collect_set(F.map_keys("key")).alias("keys"),
        *(expression.alias(f"x_{name}") for name, expression in extra.items()),
    ).collect()
    return {
        row["table"]: Facts(
            rows=row["rows"], fresh_deletes=row["fresh_deletes"], moved_deletes=row["moved_deletes"],
            moved_fills=row["moved_fills"], not_inserts=row["not_inserts"],
            truncate=(row["truncate"]["major"], row["truncate"]["minor"]) if row["truncate"] else None,
            columns=tuple(row["columns"] or ()), keys=tuple(tuple(k) for k in row["keys"] or ()),
            extra={name: row[f"x_{name}"] for name in extra},
        )
        for row in found
    }


def key_ranges(tables: list[str], catalogue: Catalogue) -> dict[str, Column]:
    """Extras: per table with a one-column integer key, the batch's lowest and highest key. A MERGE or
    a read bounded by them lets Delta skip the files whose key statistics lie outside (a snapshot's
    keys arrive in ranges, so its batches touch a few files of a large table, not all of them)."""
    ranges = {}
    for table in tables:
        schema = catalogue.get(table)
        if schema and len(schema.primary_key) == 1 and schema.columns[schema.primary_key[0]].type in _INTEGER_KEYS:
            key = F.try_element_at(F.col("key"), F.lit(schema.primary_key[0])).try_cast("bigint")
            mine = F.col("table") == table
            ranges[f"low_{table}"] = F.min(F.when(mine, key))
            ranges[f"high_{table}"] = F.max(F.when(mine, key))
    return ranges


def inserts_only(facts: Facts) -> bool:
    """Whether the batch only inserts rows of the table (a snapshot's reads, inserts): then, if the table
    holds none of the batch's keys, appending is what a MERGE would do, in fewer jobs."""
    return facts.rows > 0 and facts.not_inserts == 0


def key_range(facts: Facts, table: str) -> tuple[Any, Any] | None:
    """The (lowest, highest) key `key_ranges` found for `table`, or None (no range asked or no key)."""
    low, high = facts.extra.get(f"low_{table}"), facts.extra.get(f"high_{table}")
    return (low, high) if low is not None and high is not None else None


__all__ = ["Facts", "collect_facts", "inserts_only", "key_range", "key_ranges"]
