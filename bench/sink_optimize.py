"""`bench/sink_batches.py --optimize-every N`: a sink's Delta tables compacted between its batches
(`tide warehouse optimize`'s work), with a full read of each table before and after."""

from __future__ import annotations

import json
import time
from pathlib import Path


def optimize_every(spark, sink, done: int, every: int) -> None:
    """After every `every` batches: each table's full read (as `tide verify` reads it), then its compaction
    and vacuum (a week's retention: nothing deleted), then the same read again; one JSON line a table."""
    if not every or done % every:
        return
    from spark_jobs.sinks.delta.maintenance import DEFAULT_RETAIN_HOURS, delta_tables, maintain, session_settings

    for key, value in session_settings(spark, DEFAULT_RETAIN_HOURS).items():
        spark.conf.set(key, value)

    def read_s(path: str) -> float:
        started = time.monotonic()
        spark.read.format("delta").load(path).selectExpr("sum(length(to_json(struct(*))))").collect()
        return round(time.monotonic() - started, 2)

    for path in delta_tables(sink.folders()):
        before = read_s(path)
        started = time.monotonic()
        found = maintain(spark, path)
        seconds = round(time.monotonic() - started, 2)
        print(json.dumps({"phase": "optimize", "after_batches": done, "table": Path(path).name, "seconds": seconds,
                          "files": [found.files_before, found.files_after], "read_s": [before, read_s(path)]}),
              flush=True)
