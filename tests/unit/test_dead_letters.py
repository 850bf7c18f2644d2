"""A dead letter's encoding (pure): the reason and origin always, the value only while it fits Kafka."""

import json

from spark_jobs.changes.dead_letters import MAX_VALUE_BYTES, DeadLetter


def _letter(value: bytes | None) -> dict:
    return json.loads(DeadLetter("decode:cache", "value is not JSON", "t.public.x", 2, 41, b"k", value).encode())


def test_a_letter_carries_the_reason_the_origin_and_the_value():
    letter = _letter(b"{not json")
    assert (letter["reason"], letter["topic"], letter["partition"], letter["offset"]) \
        == ("value is not JSON", "t.public.x", 2, 41)
    assert letter["value"] == "{not json" and "value_omitted" not in letter
    assert _letter(b"\xff\x00")["value"] == "base64:/wA="


def test_a_value_too_large_for_kafka_is_left_out_with_its_size_and_where_to_find_it():
    big = b"x" * (MAX_VALUE_BYTES + 1)
    letter = _letter(big)
    assert letter["value"] is None and letter["value_bytes"] == len(big)
    assert "origin topic, partition and offset" in letter["value_omitted"]
    assert len(DeadLetter("decode:cache", "r", "t", 0, 0, b"k", big).encode()) < 1024 * 1024
