"""Micro-batches for the sink tests: CHANGE rows (tests/unit/spark_frames.change) through the pipeline's
own steps, the batch's frames as the pipeline makes them (`batch_frames`: the newest per row, persisted
for a sink of several actions) and the sink's `write`, with the frame it returns run as the pipeline runs
it (its action performs the writes)."""

from __future__ import annotations

from typing import Any

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.pipeline import batch_frames
from spark_jobs.sinks.base import Batch, Sink
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import frame


def apply(sink: Sink, spark: Any, rows: list[dict[str, Any]], catalogue: Catalogue | None = None,
          batch_id: int = 0) -> dict[int, str]:
    """Apply `rows` as one micro-batch; {position of a rejected row in `rows`: reason}."""
    numbered = [{**row, "origin": {**row["origin"], "offset": position}} for position, row in enumerate(rows)]
    with batch_frames(frame(spark, numbered), sink) as (changes, newest):
        rejected = sink.write(Batch(batch_id, spark, newest, changes, catalogue or demo_catalogue()))
        return {} if rejected is None else {row["origin"]["offset"]: row["error"] for row in rejected.collect()}
