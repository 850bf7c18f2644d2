"""The dead-letter topic: records that could not be decoded or applied, with the reason. Nothing is dropped.

Delivery is at least once (a retried Spark task may send a dead letter twice);
each carries its origin (topic, partition, offset), so duplicates are recognisable.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kafka import KafkaProducer


# A dead letter must fit Kafka's default 1 MB request; a larger record's value stays out of it
# (its origin topic, partition and offset still find it in the change topic).
MAX_VALUE_BYTES = 512 * 1024


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
        fits = self.value is None or len(self.value) <= MAX_VALUE_BYTES
        return json.dumps(
            {
                "stage": self.stage,
                "reason": self.reason,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "value": _text(self.value) if fits else None,
                **({} if fits else {"value_bytes": len(self.value), "value_omitted": "too large for the dead-letter "
                                    "topic; read it from its origin topic, partition and offset"}),
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


def send(bootstrap: str, topic: str, letters: Iterable[DeadLetter]) -> int:
    """Produce dead letters and wait for the broker's acknowledgement; returns how many were sent."""
    producer: KafkaProducer | None = None
    count = 0
    try:
        for letter in letters:
            producer = producer or KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
            producer.send(topic, key=letter.key, value=letter.encode())
            count += 1
        if producer is not None:
            producer.flush()
    finally:
        if producer is not None:
            producer.close()
    return count
