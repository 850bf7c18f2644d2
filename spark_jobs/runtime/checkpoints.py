"""A query's checkpoint folder, as Tideline reads it and sets it aside.

Spark writes `offsets/<batch>` (a batch's end offsets, before it runs) and `commits/<batch>` (once
it ran). A query whose subscription loses a topic cannot resume from its checkpoint: with
failOnDataLoss the topic's partitions, present in the checkpoint and absent from the subscription,
count as lost data and the query stops. So when a table leaves a query (`tide tables remove`), the
driver sets the checkpoint aside (`retire`) and the query starts a new one exactly where the old one
committed, less the topic (`starting_offsets`): Spark's own `startingOffsets` option, no rewriting of
Spark's files. The retired folder stays until the new checkpoint has committed a batch, so a driver
that dies in between starts from it again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

Offsets = dict[str, dict[int, int]]  # {topic: {partition: next offset}}
EARLIEST = -2  # startingOffsets' code for a partition's earliest offset


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
