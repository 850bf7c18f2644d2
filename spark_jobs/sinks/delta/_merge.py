"""The current-state MERGE, generated as text from a table's plan, and run with Delta's MERGE API.

One MERGE per table per batch, straight from the batch's source rows (spark_jobs/sinks/delta/_source.py):

    MERGE INTO <table> t USING <source> s
    ON t.k = s.k [AND t.k BETWEEN <lowest> AND <highest>]         -- the batch's key range prunes files
    WHEN MATCHED AND <s newer than t> AND s._op = 'd' THEN DELETE
    WHEN MATCHED AND <s newer than t> THEN UPDATE SET
         c = CASE WHEN <t at least s._keep['c']> THEN t.c ELSE s.c END, ...,   -- TOAST keep / fill-version rule
         tl_version_major = s.tl_version_major, tl_version_minor = ..., tl_commit_ts = ...
    WHEN NOT MATCHED AND s._op <> 'd' AND <s newer than its tombstone, if any> THEN INSERT ...

The truncate watermark is applied to the source before (a literal filter, the sink keeps it in memory);
the tombstone comes with each source row (a join in the same query). A change at or below the row's
version matches no clause: a replayed batch changes no row, and with deletion vectors Delta then
commits nothing. tests/unit/test_delta_merge.py checks the generated text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta._version import Version, keep_stored, newer, newer_or_absent, quote, text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Source columns the MERGE reads besides the table's (spark_jobs/sinks/delta/_source.py names them).
OP, KEEP, TOMB_MAJOR, TOMB_MINOR = "_op", "_keep", "_tomb_major", "_tomb_minor"
_S, _T = Version.of("s"), Version.of("t")
_TOMB = Version.of("s", TOMB_MAJOR, TOMB_MINOR)
_META = (VERSION_MAJOR, VERSION_MINOR, COMMIT_TS)


@dataclass(frozen=True)
class MergeText:
    """The clauses of one table's MERGE as SQL text (target alias t, source alias s)."""

    on: str
    delete_when: str
    update_when: str
    update_set: dict[str, str]
    insert_when: str
    insert_values: dict[str, str]

    def sql(self, target: str, source: str) -> str:
        """The whole statement (for the docs and the tests; the sink runs the clauses through the API)."""
        sets = ", ".join(f"{c} = {e}" for c, e in self.update_set.items())
        columns, values = ", ".join(self.insert_values), ", ".join(self.insert_values.values())
        return (f"MERGE INTO {target} t USING {source} s ON {self.on} "
                f"WHEN MATCHED AND {self.delete_when} THEN DELETE "
                f"WHEN MATCHED AND {self.update_when} THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED AND {self.insert_when} THEN INSERT ({columns}) VALUES ({values})")


def _literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a key bound: {value!r}")
    if isinstance(value, int):
        return f"{value}L"
    return text(str(value))


def in_key_range(column: str, key_range: tuple[Any, Any]) -> str:
    """SQL text: `column` (quoted, qualified as needed) between the batch's lowest and highest key."""
    low, high = key_range
    return f"{column} BETWEEN {_literal(low)} AND {_literal(high)}"


def merge_text(keys: tuple[str, ...], columns: list[str], key_range: tuple[Any, Any] | None = None) -> MergeText:
    """The MERGE of a table with primary key `keys` and other columns `columns`. `key_range`: the
    lowest and highest (integer) key of the batch, for a one-column key: Delta skips the files whose
    key statistics lie outside it (a snapshot's keys arrive in ranges)."""
    on = [f"t.{quote(k)} = s.{quote(k)}" for k in keys]
    if key_range is not None and len(keys) == 1:
        on.append(in_key_range(f"t.{quote(keys[0])}", key_range))
    guard = newer(_S, _T)
    kept = {
        quote(c): f"CASE WHEN {keep_stored(Version.field(f'try_element_at(s.{KEEP}, {text(c)})'), _T)} "
                  f"THEN t.{quote(c)} ELSE s.{quote(c)} END"
        for c in columns
    }
    meta = {quote(c): f"s.{quote(c)}" for c in _META}
    return MergeText(
        on=" AND ".join(on),
        delete_when=f"{guard} AND s.{OP} = 'd'",
        update_when=guard,
        update_set=kept | meta,
        insert_when=f"s.{OP} <> 'd' AND {newer_or_absent(_S, _TOMB)}",
        insert_values={quote(c): f"s.{quote(c)}" for c in (*keys, *columns)} | meta,
    )


def append_inserts(path: str, source: DataFrame, values: Mapping[str, str]) -> None:
    """What a MERGE does to a table that holds none of the source's keys: insert every source row with
    its insert `values` (column → SQL text over the source, aliased s). One append instead of the
    MERGE's passes (the files to rewrite, the rewrite, deletion vectors)."""
    source.alias("s").selectExpr(*(f"{value} AS {column}" for column, value in values.items())) \
        .write.format("delta").mode("append").save(path)


def run_merge(spark: SparkSession, path: str, source: DataFrame, merge: MergeText) -> None:
    from delta.tables import DeltaTable

    (
        DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), merge.on)
        .whenMatchedDelete(merge.delete_when)
        # Copies typed as the API takes them (dict[str, str | Column]: a dict[str, str] is not one, as dict
        # is invariant in its values).
        .whenMatchedUpdate(merge.update_when, set=dict(merge.update_set))
        .whenNotMatchedInsert(merge.insert_when, values=dict(merge.insert_values))
        .execute()
    )


__all__ = ["MergeText", "append_inserts", "in_key_range", "merge_text", "run_merge"]
