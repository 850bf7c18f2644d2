"""Bad input in a change topic, on the running pipeline of conftest.py (docs/reliability.md,
Bad-input catalogue): a well-formed change of a table pipeline.yaml does not name is dead-lettered
by every sink with the reason, and the changes after it still apply. (Malformed JSON:
tests/e2e/test_apply.py.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from kafka import KafkaProducer

from services.jobs import dlq
from services.stack import postgres
from spark_jobs.settings import SINKS
from tests.e2e.support import REDIS_DB
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

RECORDS = Path(__file__).parents[1] / "unit" / "fixtures" / "debezium_records.json"


def _record_of_another_table(table: str) -> tuple[bytes, bytes]:
    """A real Debezium insert (captured from the stack) whose source names `table`."""
    record = next(r for r in json.loads(RECORDS.read_text()) if r["name"] == "customers_snapshot")
    value = json.loads(record["value"])
    value["payload"]["source"]["table"] = table
    return record["key"].encode(), json.dumps(value).encode()


def test_a_change_of_an_unknown_table_is_dead_lettered_by_every_sink_and_later_changes_apply(run, stack):
    _, pipeline, _ = run
    topic, table = pipeline.topic("customers"), f"no_such_table_{uuid.uuid4().hex[:6]}"
    key, value = _record_of_another_table(table)
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    stray = producer.send(topic, key=key, value=value).get(timeout=30)
    producer.close()
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        after = conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'after the stray') RETURNING id",
                             (f"{uuid.uuid4().hex}@after.test",)).fetchone()[0]
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    wait_until(lambda: cache.exists(f"customers:{after}"), 90, "the change after the stray record applied")

    def dead_letters():
        letters = [d for d in dlq.read_letters(stack, "tideline.dlq")
                   if d["topic"] == topic and d["offset"] == stray.offset and d["partition"] == stray.partition]
        return letters if {letter["stage"] for letter in letters} == {f"decode:{sink}" for sink in SINKS} else None

    letters = wait_until(dead_letters, 90, "each sink's dead letter of the stray record")
    assert all(f"table {table} is not configured in pipeline.yaml" in letter["reason"] for letter in letters), letters
