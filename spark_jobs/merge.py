"""Order-safe merging of changes: pure functions shared by the streaming job and every sink.

Versions are Debezium's source.sequence pairs (see `Change.sequence`), compared
lexicographically: they grow with commit order, for snapshot records too (which
sort first). The rules every sink keeps (design invariant 3):

- an upsert or delete is applied only if its version is above what the sink
  holds for the key: the row's version, the key's tombstone, and the table's
  truncate watermark, whichever is highest (`stored_version`);
- an equal version is a replay and changes nothing;
- a truncate raises the table's watermark and removes every row below it, so a
  late older change cannot resurrect a truncated row either;
- an unchanged-TOAST column keeps the value the sink holds; one filled from an
  older change of the batch keeps it too if the sink's row is at least as new as
  the change the value came from (`keep_from`, `kept_columns`), since that
  change may be a stale redelivery.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from spark_jobs.changes import Change

Version = tuple[int, int]
ZERO: Version = (0, 0)
TRUNCATE_KEY = "__truncate__"
MAX_ID_BYTES = 512  # Elasticsearch's _id limit; longer keys are hashed


def doc_id(key: dict[str, Any]) -> str:
    """A stable id for a primary key: the value itself for one column, a JSON list for a composite key.

    Debezium sends key columns in primary-key order, so the same row always maps
    to the same id. Ids longer than Elasticsearch allows are replaced by a hash.
    """
    values = list(key.values())
    encoded = str(values[0]) if len(values) == 1 else json.dumps(values, separators=(",", ":"), default=str)
    if len(encoded.encode()) > MAX_ID_BYTES:
        return "sha256:" + hashlib.sha256(encoded.encode()).hexdigest()
    return encoded


def group_key(change: Change) -> tuple[str, str]:
    """(table, id) a batch is deduplicated on; all truncates of a table share one group."""
    return (change.table, TRUNCATE_KEY if change.op == "t" else doc_id(change.key))


def newer(a: Change, b: Change) -> Change:
    """The newer of two changes to the same row, with unchanged-TOAST columns filled from the older.

    Each filled column takes the newest value the two know of (by the version of the change it
    came from, recorded in `filled`), so the result is the same in any grouping: associative and
    commutative, and Spark may reduce a batch's changes per key in any order. A duplicate (same
    version) yields the same change.
    """
    new, old = (a, b) if a.sequence >= b.sequence else (b, a)
    if new.after is None or old.after is None:
        return new
    offered = {column: old.filled.get(column, old.sequence) for column in (new.unavailable | new.filled.keys())
               if column in old.after}
    better = {column: version for column, version in offered.items()
              if column in new.unavailable or version > new.filled[column]}
    if not better:
        return new
    return replace(
        new,
        after={**new.after, **{column: old.after[column] for column in better}},
        unavailable=new.unavailable - better.keys(),
        filled={**new.filled, **better},
    )


def newest_per_row(changes: Iterable[Change]) -> list[Change]:
    """One change per (table, row) — the newest — plus the newest truncate per table."""
    kept: dict[tuple[str, str], Change] = {}
    for change in changes:
        group = group_key(change)
        kept[group] = newer(kept[group], change) if group in kept else change
    return list(kept.values())


def stored_version(row: Version | None, tombstone: Version | None, watermark: Version | None) -> Version:
    """The version a change must beat: the highest of the row's, its tombstone's and the table's truncate."""
    return max(row or ZERO, tombstone or ZERO, watermark or ZERO)


def applies(change: Change, stored: Version) -> bool:
    return change.sequence > stored


def keep_from(change: Change) -> dict[str, Version]:
    """The columns whose stored value a sink may keep, each with the version its stored row must have
    reached for that: any for an unchanged-TOAST column, and for a filled one the version of the
    change the value came from (a stale redelivery's old image must not overwrite a newer value)."""
    return {**dict.fromkeys(change.unavailable, ZERO), **change.filled}


def kept_columns(change: Change, row: Version) -> set[str]:
    """The columns a sink whose stored row is at version `row` keeps (every sink applies this rule)."""
    return {column for column, needed in keep_from(change).items() if row >= needed}


def merged_row(change: Change, stored_row: dict[str, Any] | None, row: Version = ZERO) -> dict[str, Any]:
    """The row to write for an upsert over `stored_row` (at version `row`): `kept_columns` keep their
    stored value; a column the sink does not hold takes the change's value, or stays absent."""
    assert change.after is not None
    kept = {column: stored_row[column] for column in kept_columns(change, row) if stored_row and column in stored_row}
    return {**change.after, **kept}
