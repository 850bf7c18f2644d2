"""The comparison behind `tide verify`, free of any store: content hashes spilled to buckets.

Rows are made canonical first (services/verify/canonical.py). Memory stays bounded for any table
size: each side's (doc_id, hash) pairs are spilled to N bucket files by a hash of the doc_id, and
buckets are compared one at a time, so only one bucket of the source is ever held in memory.
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Kind = Literal["missing", "extra", "different", "duplicate", "interval"]
# missing: in PostgreSQL, not in the sink; extra: in the sink only; different: content hash differs;
# duplicate: a second row for one key in a store that can hold two (a Delta table), or a second copy
# of one version in a history table; interval: a history version's valid_to or is_current does not
# follow from the row's versions (services/verify/derived.py).
KINDS: tuple[Kind, ...] = ("missing", "extra", "different", "duplicate", "interval")

# Aim for about this many source rows per bucket: a bucket's dict then takes a few MB.
ROWS_PER_BUCKET = 50_000
MAX_BUCKETS = 256  # open files per spill; 256 buckets x 50k rows still keeps 12.8M rows at ~10 MB a bucket


# ---- spilling to buckets ----------------------------------------------------------------------------


def bucket_count(estimated_rows: int) -> int:
    return max(1, min(MAX_BUCKETS, math.ceil(max(estimated_rows, 0) / ROWS_PER_BUCKET)))


def bucket_of(row_id: str, buckets: int) -> int:
    return zlib.crc32(row_id.encode("utf-8", "surrogatepass")) % buckets


@dataclass(frozen=True)
class Spilled:
    """One side's (doc_id, hash) pairs in bucket files `<folder>/<n>`; `rows` pairs in all."""

    folder: Path
    buckets: int
    rows: int

    def path(self, bucket: int) -> Path:
        return self.folder / str(bucket)

    def pairs(self, bucket: int) -> Iterator[tuple[str, str]]:
        with open(self.path(bucket), encoding="utf-8", errors="surrogatepass") as lines:
            for line in lines:
                encoded, digest = line.rstrip("\n").rsplit("\t", 1)
                yield json.loads(encoded), digest

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def spill(pairs: Iterable[tuple[str, str]], folder: Path, buckets: int) -> Spilled:
    """Write (doc_id, hash) pairs to `buckets` files under `folder` (created; must not hold a spill)."""
    folder.mkdir(parents=True, exist_ok=False)
    files = [open(folder / str(n), "w", encoding="utf-8", errors="surrogatepass")  # noqa: SIM115 - closed in the finally
             for n in range(buckets)]
    rows = 0
    try:
        for doc_id, digest in pairs:
            # JSON-quoted, so a key holding a tab or a newline cannot break the line format.
            files[bucket_of(doc_id, buckets)].write(f"{json.dumps(doc_id)}\t{digest}\n")
            rows += 1
    finally:
        for handle in files:
            handle.close()
    return Spilled(folder, buckets, rows)


# ---- comparing ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """One kind of disagreement between PostgreSQL and one sink for one table: how many rows, and
    the doc ids of the first few found (sorted)."""

    table: str
    sink: str
    kind: Kind
    count: int
    examples: tuple[str, ...]


@dataclass
class Tally:
    """Counts per kind and up to `limit` example doc ids each: the whole result, whatever the size."""

    limit: int = 5
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {kind: [] for kind in KINDS})

    def record(self, kind: Kind, row_id: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.limit:
            self.examples[kind].append(row_id)

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())

    def divergences(self, table: str, sink: str) -> list[Divergence]:
        return [
            Divergence(table, sink, kind, self.counts[kind], tuple(sorted(self.examples[kind])))
            for kind in KINDS
            if self.counts[kind]
        ]


def compare(source: Spilled, sink: Spilled, examples: int = 5, unique_ids: bool = False) -> Tally:
    """Compare two spills bucket by bucket (both must use the same bucket count).

    `unique_ids`: the sink is keyed by doc id (an Elasticsearch index, Redis keys), so a repeated
    id can only be its scan returning a key twice (Redis SCAN may) and is skipped. Otherwise (Delta)
    a repeated id is a second row for one key: `duplicate`.
    """
    if source.buckets != sink.buckets:
        raise ValueError(f"bucket counts differ: {source.buckets} != {sink.buckets}")
    tally = Tally(limit=examples)
    for bucket in range(source.buckets):
        compare_bucket(source.pairs(bucket), sink.pairs(bucket), tally, unique_ids)
    return tally


def compare_bucket(
    source: Iterable[tuple[str, str]], sink: Iterable[tuple[str, str]], tally: Tally, unique_ids: bool = False
) -> None:
    """Only the source side is held (one bucket's dict); the sink side is streamed past it."""
    expected = dict(source)
    seen: set[str] = set()
    for doc_id, digest in sink:
        if doc_id in seen:
            if not unique_ids:
                tally.record("duplicate", doc_id)
            continue
        seen.add(doc_id)
        wanted = expected.get(doc_id)
        if wanted is None:
            tally.record("extra", doc_id)
        elif wanted != digest:
            tally.record("different", doc_id)
    for doc_id in expected.keys() - seen:
        tally.record("missing", doc_id)


def reconcile_pairs(
    source: Iterable[tuple[str, str]],
    sink: Iterable[tuple[str, str]],
    work_dir: Path,
    buckets: int = 16,
    examples: int = 5,
    unique_ids: bool = False,
) -> Tally:
    """Spill both sides under `work_dir` and compare them; the spills are removed afterwards."""
    left = spill(source, work_dir / "source", buckets)
    right = spill(sink, work_dir / "sink", buckets)
    try:
        return compare(left, right, examples, unique_ids)
    finally:
        left.remove()
        right.remove()
