"""The dead-letter topic: records that could not be decoded or applied, with the reason. Nothing is dropped.

A letter is one JSON object: stage (`decode:<sink>` or `apply:<sink>`), reason, the record's origin
(topic, partition, offset), its value (text, `base64:...` for bytes that are not UTF-8, left out
above MAX_VALUE_BYTES with `value_bytes` and `value_omitted` instead) and `dead_at_ms`. The apply jobs
build letters with Spark SQL and write them with Spark's Kafka sink (`write`), as the last action of a
micro-batch; `DeadLetter` is the same letter built in Python, for tools and tests.

Delivery is at least once (a retried batch may write a letter twice); the origin makes duplicates
recognisable, and `tide status` counts distinct origins.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs.runtime.expressions import reused

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# A dead letter must fit Kafka's default 1 MB request; a larger record's value stays out of it
# (its origin topic, partition and offset still find it in the change topic).
MAX_VALUE_BYTES = 512 * 1024
_OMITTED = "too large for the dead-letter topic; read it from its origin topic, partition and offset"


@dataclass(frozen=True)
class DeadLetter:
    stage: str  # "decode:<sink>" or "apply:<sink>"
    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    def encode(self) -> bytes:
        size = None if self.value is None else len(self.value)
        fits = size is None or size <= MAX_VALUE_BYTES
        return json.dumps(
            {
                "stage": self.stage,
                "reason": self.reason,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "value": _text(self.value) if fits else None,
                **({} if fits else {"value_bytes": size, "value_omitted": _OMITTED}),
                "dead_at_ms": int(time.time() * 1000),
            }
        ).encode()


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def letters(rejected: DataFrame, stage: str) -> DataFrame:
    """`CHANGE` rows with `error` set → (key, value) rows of the dead-letter topic, as `DeadLetter.encode`."""
    return rejected.select(*_letter(stage))


@reused
def _letter(stage: str) -> tuple[Column, Column]:
    from pyspark.sql import functions as F

    return F.lit(None).cast("binary").alias("key"), letter_value(stage, F.col("error")).alias("value")


def letter_value(stage: str, reason: Column) -> Column:
    """A row's dead letter (`DeadLetter.encode` in SQL) as bytes: its `origin` and `letter_value`
    (the record's value, or NULL), with `reason`."""
    from pyspark.sql import functions as F

    raw = F.col("letter_value")
    fits = raw.isNull() | (F.octet_length(raw) <= MAX_VALUE_BYTES)
    text = F.when(F.is_valid_utf8(raw), raw.cast("string")).otherwise(F.concat(F.lit("base64:"), F.base64(raw)))
    origin = F.col("origin")
    letter = F.struct(
        F.lit(stage).alias("stage"), reason.alias("reason"), origin["topic"].alias("topic"),
        origin["partition"].alias("partition"), origin["offset"].alias("offset"),
        F.when(fits, text).alias("value"),
        F.when(~fits, F.octet_length(raw)).alias("value_bytes"), F.when(~fits, F.lit(_OMITTED)).alias("value_omitted"),
        # Read per letter on the executor: current_timestamp() would become a literal in the generated
        # code, whose text then changes every batch and is compiled again.
        F.expr("java_method('java.lang.System', 'currentTimeMillis')").cast("bigint").alias("dead_at_ms"),
    )
    return F.to_json(letter).cast("binary")


def write(frame: DataFrame, bootstrap: str, topic: str) -> None:
    """Produce the letters with Spark's Kafka sink (acks=all): an action, run on the executors."""
    (frame.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.acks", "all").option("kafka.linger.ms", "5").save())
