"""A micro-batch that keeps failing is planned again smaller (spark_jobs/runtime/checkpoints.batch_cap): Spark
itself, reading a real Kafka topic, plans the batch again from the last commit under the new cap, and
every record is still read, each once after the failures."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaProducer

from services.jobs.driver import job_settings
from services.settings import StackSettings
from spark_jobs.pipeline import source
from spark_jobs.runtime import checkpoints

pytestmark = pytest.mark.stack

CAP = 2 * checkpoints.MIN_REPLANNED  # planned again under half of it: the floor
RECORDS = 3 * checkpoints.MIN_REPLANNED


class FailedBatch(RuntimeError):
    """What a batch that exhausted the driver's heap looks like to the next start: planned, not committed."""


def test_a_batch_that_failed_twice_is_planned_again_under_half_the_cap_and_nothing_is_skipped(
        stack: StackSettings, spark, tmp_path):
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    topic = f"replan-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    for value in range(RECORDS):
        producer.send(topic, key=b"k", value=str(value).encode())
    producer.flush()
    producer.close()
    settings = job_settings(stack)
    checkpoint = tmp_path / "query"
    seen: list[tuple[int, list[int]]] = []

    def start(fail: bool):
        def write(frame, batch_id: int) -> None:
            seen.append((batch_id, sorted(int(row.v) for row in frame.select(F.col("value").cast("string").alias("v"))
                                          .collect())))
            if fail:
                raise FailedBatch(f"batch {batch_id}")

        cap = checkpoints.batch_cap(checkpoint, CAP)
        records = source(spark, settings, [topic], "earliest", cap)
        return records.writeStream.foreachBatch(write).option("checkpointLocation", str(checkpoint)).start()

    for _ in range(2):  # the batch fails as planned, and again when replayed
        query = start(fail=True)
        with pytest.raises(StreamingQueryException):
            query.awaitTermination(timeout=120)
    query = start(fail=False)
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    first = list(range(CAP))
    assert seen == [(0, first), (0, first), (0, list(range(CAP // 2))), (1, list(range(CAP // 2, CAP))),
                    (2, list(range(CAP, RECORDS)))]
    assert checkpoints.pending_batch(checkpoint) is None
