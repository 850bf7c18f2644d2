"""A query's checkpoint folder, as Tideline reads it and sets it aside.

Spark writes `offsets/<batch>` (a batch's end offsets, before it runs) and `commits/<batch>` (once
it ran). A query whose subscription loses a topic cannot resume from its checkpoint: with
failOnDataLoss the topic's partitions, present in the checkpoint and absent from the subscription,
count as lost data and the query stops. So when a table leaves a query (`tide tables remove`), the
driver sets the checkpoint aside (`retire`) and the query starts a new one exactly where the old one
committed, less the topic (`starting_offsets`): Spark's own `startingOffsets` option, no rewriting of
Spark's files. The retired folder stays until the new checkpoint has committed a batch, so a driver
that dies in between starts from it again.

A micro-batch that did not finish is replayed by Spark with the same end offsets, so a batch too big
for the driver's heap killed it again at every restart (measured: an analytics batch of 100,000 changes,
15 times in a row). `batch_cap` counts the starts that find a batch planned and not committed; from
the second one on it deletes that batch's offsets, the one file Tideline removes from Spark's, and
Spark plans the batch again from the last commit, under a cap halved per further start.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from spark_jobs.model.files import replace_text

log = logging.getLogger("tideline.pipeline")

Offsets = dict[str, dict[int, int]]  # {topic: {partition: next offset}}
EARLIEST = -2  # startingOffsets' code for a partition's earliest offset
# The smallest cap a batch is planned again under: one that keeps failing for a reason other than its
# size (a store refusing it) shrinks no further than this.
MIN_REPLANNED = 1_000
ATTEMPTS = "tideline-attempts"  # in the checkpoint folder, so it goes with it (a rebuild, `retire`)


def _batches(folder: Path) -> list[int]:
    return [int(path.name) for path in folder.glob("[0-9]*")] if folder.is_dir() else []


def has_commits(checkpoint: Path) -> bool:
    return bool(_batches(checkpoint / "commits"))


def retired(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + ".retired")


def follow_up(checkpoint: Path) -> Path:
    """The checkpoint of a real-time query's follow-up query (spark_jobs/realtime.py), beside its own."""
    return checkpoint.with_name(f"{checkpoint.name}-follow-up")


def committed_offsets(checkpoint: Path) -> Offsets:
    """{topic: {partition: next offset}} after the newest committed micro-batch; a new checkpoint
    that continues a retired one has the retired one's until it commits; {} before the first batch."""
    commits = _batches(checkpoint / "commits")
    if not commits:
        return committed_offsets(retired(checkpoint)) if retired(checkpoint).is_dir() else {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    source = json.loads(lines[2])  # line 0: version, line 1: batch metadata, then one line per source
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in source.items()}


def query_id(checkpoint: Path) -> str | None:
    """The id Spark gave the query on its first start (the checkpoint's `metadata` file keeps it, so it
    stays the same across restarts); None before the first start."""
    try:
        return json.loads((checkpoint / "metadata").read_text())["id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def furthest(*positions: Offsets) -> Offsets:
    """Per partition, the furthest of several positions of one query (e.g. its checkpoint's and what its
    writers published as applied since)."""
    result: Offsets = {}
    for offsets in positions:
        for topic, parts in offsets.items():
            merged = result.setdefault(topic, {})
            for part, offset in parts.items():
                merged[part] = max(offset, merged.get(part, offset))
    return result


def retire(checkpoint: Path) -> None:
    """Set the checkpoint aside (called with its query stopped). One that never committed is only
    deleted: the retired one before it still holds where to start."""
    if has_commits(checkpoint):
        shutil.rmtree(retired(checkpoint), ignore_errors=True)
        checkpoint.rename(retired(checkpoint))
    else:
        shutil.rmtree(checkpoint, ignore_errors=True)


def starting_offsets(checkpoint: Path, topics: list[str], partitions: int) -> str:
    """The query's startingOffsets: "earliest" (a new sink reads the topics from the start), or, for a
    new checkpoint that continues a retired one, where that one committed for the topics still
    subscribed, and the earliest offset of each of `partitions` partitions of a topic it never read
    (Spark wants every partition named). Spark reads it only when the checkpoint is new."""
    if has_commits(checkpoint) or not retired(checkpoint).is_dir():
        return "earliest"
    committed = committed_offsets(retired(checkpoint))
    chosen = {topic: committed.get(topic) or dict.fromkeys(range(partitions), EARLIEST) for topic in topics}
    return json.dumps({topic: {str(p): o for p, o in sorted(parts.items())} for topic, parts in chosen.items()})


def drop_retired(checkpoint: Path) -> None:
    """Delete the retired folder once the new checkpoint has committed (it is no longer needed)."""
    if retired(checkpoint).is_dir() and has_commits(checkpoint):
        shutil.rmtree(retired(checkpoint), ignore_errors=True)


def pending_batch(checkpoint: Path) -> int | None:
    """The batch Spark planned (its offsets logged) and did not commit: the one it replays at start."""
    planned = _batches(checkpoint / "offsets")
    newest = max(planned, default=None)
    return newest if newest is not None and newest not in _batches(checkpoint / "commits") else None


def batch_cap(checkpoint: Path, cap: int) -> int:
    """The most records the next batch of the micro-batch query starting on `checkpoint` takes, for its
    configured `cap`; called once per start. With no batch pending, `cap`. A pending batch is replayed as
    planned the first time (one stop or kill says nothing about its size); if it is still pending at the
    next start, its offsets are deleted and it is planned again under cap/2, then cap/4, ..., at least
    MIN_REPLANNED. A batch planned again smaller is safe: sink writes are idempotent and version-guarded,
    so whatever part of the larger batch reached a store counts once (spark_jobs/pipeline.py)."""
    attempts = checkpoint / ATTEMPTS
    pending = pending_batch(checkpoint)
    if pending is None:
        attempts.unlink(missing_ok=True)
        return cap
    try:
        seen = json.loads(attempts.read_text())
    except (OSError, ValueError):
        seen = {}
    starts = seen.get("starts", 0) + 1 if seen.get("batch") == pending else 1
    replace_text(attempts, json.dumps({"batch": pending, "starts": starts}))
    if starts == 1:
        return cap
    smaller = max(cap >> (starts - 1), min(cap, MIN_REPLANNED))
    for name in (str(pending), f".{pending}.crc"):  # the checksum Hadoop's local file system writes beside it
        (checkpoint / "offsets" / name).unlink(missing_ok=True)
    log.warning("%s: batch %d did not finish in %d attempts; planning it again with at most %d records",
                checkpoint.name, pending, starts, smaller)
    return smaller
