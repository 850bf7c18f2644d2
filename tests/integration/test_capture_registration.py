"""Registering a connector against the real stack: bad input refused with nothing registered half-way,
columns kept out of Kafka (exclude_columns), and change topics created before any record."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectError
from services.db import migrate
from services.stack import postgres
from services.stack.service import StackError
from services.verify import readers
from spark_jobs.model.config import load
from tests.capture_support import changes, customers_only, fold, registered, unique_pipeline
from tests.waiting import wait_until

pytestmark = pytest.mark.stack


# --- bad input: a clear error, and nothing registered half-way --------------------------------


def test_config_naming_a_missing_table_is_refused_and_registers_nothing(stack):
    base = unique_pipeline(load(stack.pipeline_file), "bad")
    pipeline = base.model_copy(update={"tables": {**base.tables, "no_such_table": base.tables["customers"]}})
    with pytest.raises(StackError, match=r"public\.no_such_table does not exist: run `tide db migrate`"):
        registration.apply(stack, pipeline)
    assert not registered(stack, pipeline.source.connector)


def test_table_without_primary_key_is_refused_and_registers_nothing(stack):
    table = f"nopk_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (a int)")
    try:
        base = unique_pipeline(load(stack.pipeline_file), "bad")
        pipeline = base.model_copy(update={"tables": {**base.tables, table: base.tables["customers"]}})
        with pytest.raises(StackError, match=rf"public\.{table} has no primary key"):
            registration.apply(stack, pipeline)
        assert not registered(stack, pipeline.source.connector)
    finally:
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")


def test_unreachable_connect_is_a_clear_error(stack):
    unreachable = stack.model_copy(update={"connect_port": 1})
    with pytest.raises(ConnectError, match=r"cannot reach Kafka Connect at http://127\.0\.0\.1:1 .* is the stack up"):
        registration.apply(unreachable, unique_pipeline(load(stack.pipeline_file), "bad"))


# --- columns kept out of Kafka (exclude_columns) -------------------------------------------------


def test_excluded_columns_never_reach_kafka_and_verify_leaves_them_out(stack):
    migrate.upgrade(stack)
    pipeline = customers_only(stack, exclude_columns=["email", "country"])
    marker = f"pii{uuid.uuid4().hex[:8]}"
    registration.apply(stack, pipeline)
    try:
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
            key = conn.execute(
                "INSERT INTO customers (email, name, country) VALUES (%s, %s, 'SE') RETURNING id",
                (f"{marker}@private.test", marker),
            ).fetchone()[0]
        topic = pipeline.topic("customers")
        wait_until(lambda: fold(changes(stack, topic)).get((("id", key),)), 60, "the new customer in the topic")
        rows = [change.after for _, change in changes(stack, topic) if change is not None and change.after]
        assert rows and all("email" not in row and "country" not in row for row in rows)
        assert fold(changes(stack, topic))[(("id", key),)]["name"] == marker
        with readers.connect_source(postgres.conninfo(stack)) as conn:
            shape, _ = readers.source_shape(conn, "public", "customers", pipeline.tables["customers"].exclude_columns)
        assert "email" not in shape.column_names and "name" in shape.column_names
    finally:
        registration.delete(stack, pipeline, drop_slot=True)


@pytest.mark.parametrize(
    ("excluded", "problem"),
    [(["id"], r"customers\.id, part of the primary key"), (["no_such"], r"customers\.no_such, which does not exist")],
)
def test_excluding_a_key_or_unknown_column_is_refused_and_registers_nothing(stack, excluded, problem):
    pipeline = customers_only(stack, exclude_columns=excluded)
    with pytest.raises(StackError, match=problem):
        registration.apply(stack, pipeline)
    assert not registered(stack, pipeline.source.connector)


# --- change topics ----------------------------------------------------------------------------------


def test_change_topics_are_created_compacted_before_any_record_and_only_once(stack):
    """A Spark query subscribed to a topic Debezium has not created yet (an empty table) would stop."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    pipeline = unique_pipeline(load(stack.pipeline_file), "topics")
    topics = [pipeline.topic(table) for table in pipeline.tables]
    assert registration.ensure_change_topics(stack, pipeline) == topics
    assert registration.ensure_change_topics(stack, pipeline) == []
    admin = KafkaAdminClient(bootstrap_servers=stack.kafka_bootstrap)
    try:
        partitions = {t["name"] if "name" in t else t["topic"]: len(t["partitions"])
                      for t in admin.describe_topics(topics)}
        assert partitions == dict.fromkeys(topics, pipeline.source.partitions)
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics])
        found = next(iter(configs.values()))
        policies = {name: str(values.get("cleanup.policy")) for name, values in found.items()}
        assert all("compact" in policy for policy in policies.values()) and set(policies) == set(topics), policies
        # A sink behind by less than the lag reads every change, placeholder updates' predecessors included.
        lags = {name: values["min.compaction.lag.ms"]["value"] for name, values in found.items()}
        assert lags == dict.fromkeys(topics, str(pipeline.source.compaction_lag_hours * 3_600_000)), lags
        # A topic that exists (a stack made before the setting, or a changed lag) takes the pipeline's.
        shorter = pipeline.model_copy(update={"source": pipeline.source.model_copy(update={"compaction_lag_hours": 1})})
        assert registration.ensure_change_topics(stack, shorter) == []
        found = next(iter(admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]).values()))
        assert {name: values["min.compaction.lag.ms"]["value"] for name, values in found.items()} == dict.fromkeys(
            topics, "3600000")
    finally:
        admin.delete_topics(topics)
        admin.close()
