"""Micro-batches for the sink tests: CHANGE rows (tests/unit/spark_frames.change) through the pipeline's
own steps, the newest per row (spark_jobs/changes/newest.py) and the sink's `write`, with the frame it returns
run as the pipeline runs it (its action performs the writes)."""

from __future__ import annotations

from typing import Any

from spark_jobs.changes.newest import newest_per_row
from spark_jobs.model.catalogue import Catalogue
from spark_jobs.sinks.base import Batch, Sink
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import frame


def apply(sink: Sink, spark: Any, rows: list[dict[str, Any]], catalogue: Catalogue | None = None,
          batch_id: int = 0) -> dict[int, str]:
    """Apply `rows` as one micro-batch; {position of a rejected row in `rows`: reason}."""
    numbered = [{**row, "origin": {**row["origin"], "offset": position}} for position, row in enumerate(rows)]
    newest = newest_per_row(frame(spark, numbered))
    rejected = sink.write(Batch(batch_id, spark, newest, frame(spark, numbered), catalogue or demo_catalogue()))
    return {} if rejected is None else {row["origin"]["offset"]: row["error"] for row in rejected.collect()}
