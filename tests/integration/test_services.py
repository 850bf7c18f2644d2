"""Each service of the local stack does its real job, reached the way users reach it."""

from __future__ import annotations

import json
import uuid

import httpx
import psycopg
import pytest
import redis
from elasticsearch import Elasticsearch
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from services.settings import StackSettings
from services.stack import jars, postgres
from services.versions import pinned
from tests.waiting import wait_until

pytestmark = pytest.mark.stack


def test_postgres_has_logical_wal_and_replication_slots(stack: StackSettings):
    with psycopg.connect(postgres.conninfo(stack)) as conn:
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        assert int(conn.execute("SHOW max_replication_slots").fetchone()[0]) > 0
        server_major = conn.execute("SHOW server_version").fetchone()[0].split(".")[0]
        assert server_major == pinned().postgresql


def test_redis_answers_ping_with_the_pinned_version(stack: StackSettings):
    client = redis.Redis(host=stack.host, port=stack.redis_port)
    assert client.ping() is True
    assert client.info("server")["redis_version"].startswith(pinned().redis)
    client.close()


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_kafka_topic_create_produce_consume_round_trip(stack: StackSettings):
    topic = _topic("roundtrip")
    admin = KafkaAdminClient(bootstrap_servers=stack.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1,
                                  topic_configs={"cleanup.policy": "compact"})])
    admin.close()

    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    for i in range(10):
        producer.send(topic, key=f"k{i}".encode(), value=json.dumps({"i": i}).encode())
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(
        topic, bootstrap_servers=stack.kafka_bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=1000
    )
    received: list[int] = []

    def all_received() -> bool:
        received.extend(json.loads(record.value)["i"] for record in consumer)
        return len(received) >= 10

    wait_until(all_received, timeout=60, reason="10 records consumed back")
    consumer.close()
    assert sorted(received) == list(range(10))


def test_connect_lists_the_debezium_postgres_plugin(stack: StackSettings):
    plugins = httpx.get(f"http://{stack.host}:{stack.connect_port}/connector-plugins", timeout=10).json()
    postgres_plugins = [p for p in plugins if p["class"] == "io.debezium.connector.postgresql.PostgresConnector"]
    assert postgres_plugins, plugins
    assert postgres_plugins[0]["version"] == pinned().debezium


def test_elasticsearch_answers_with_the_pinned_version_and_the_client_indexes_and_searches(stack: StackSettings):
    root = httpx.get(f"http://{stack.host}:{stack.elasticsearch_port}", timeout=10).json()
    assert root["version"]["number"] == pinned().elasticsearch

    es = Elasticsearch(f"http://{stack.host}:{stack.elasticsearch_port}")
    index = _topic("smoke")
    es.indices.create(
        index=index,
        mappings={"properties": {"sku": {"type": "keyword"}, "name": {"type": "text"}, "price": {"type": "double"}}},
    )
    es.index(index=index, id="1", document={"sku": "A-1", "name": "Blue ceramic mug", "price": 12.5}, refresh=True)
    hits = es.search(index=index, query={"match": {"name": "mug"}})["hits"]["hits"]
    assert [hit["_source"]["sku"] for hit in hits] == ["A-1"]
    es.indices.delete(index=index)
    es.close()


def test_pyspark_reads_a_kafka_topic_and_writes_a_delta_table(stack: StackSettings, tmp_path):
    from spark_jobs.runtime.session import build_session

    topic = _topic("spark")
    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    for i in range(5):
        producer.send(topic, key=str(i).encode(), value=json.dumps({"id": i, "name": f"row {i}"}).encode())
    producer.flush()
    producer.close()

    spark = build_session("tideline-stack-test", jars.bundle_dir(stack, "spark"))
    try:
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", stack.kafka_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        )
        table = str(tmp_path / "delta-table")
        frame.write.format("delta").save(table)
        rows = spark.read.format("delta").load(table).orderBy("key").collect()
    finally:
        spark.stop()
    assert [row.key for row in rows] == ["0", "1", "2", "3", "4"]
    assert json.loads(rows[2].value) == {"id": 2, "name": "row 2"}
