"""The apply jobs end to end: PostgreSQL → Debezium → Kafka → Spark driver → Elasticsearch, Redis, Delta.

A real driver process (`python -m spark_jobs`, started the way `tide jobs start`
starts it; the `run` fixture in conftest.py) applies a connector of the tests' own (own slot,
topics, index names, Redis database, warehouse and checkpoints), while a seeded workload
writes to every demo table. `tide verify` (PostgreSQL as the oracle) decides.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from deltalake import DeltaTable, QueryBuilder
from kafka import KafkaProducer

from services.bench import measure
from services.capture.connector import snapshot
from services.demo.workload import description
from services.jobs import driver, lag
from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.verify import verify
from spark_jobs.changes.envelope import row_id
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import SINKS
from tests.capture_support import read_topic
from tests.e2e.support import (
    CONVERGE_S,
    REDIS_DB,
    Workload,
    caught_up,
    converged,
    dead_lettered_by_every_sink,
    redis_versions,
    tide,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

ES_DOWN_S = 60


def _clean(settings: StackSettings, pipeline: PipelineConfig, tables=None) -> bool:
    return not verify(settings, pipeline=pipeline, tables=tables)


def test_snapshot_then_a_minute_of_writes_converge_in_every_sink(run):
    jobs, pipeline, writer = run
    done = writer.finish(stop=False)  # runs for WORKLOAD_SECONDS while the jobs apply
    assert done > 300, f"the workload ran only {done} operations"
    converged(jobs, pipeline, timeout=CONVERGE_S)


def test_search_and_cache_writers_publish_what_they_applied_a_deletes_tombstone_too(run, stack):
    """`tide status` reads these positions beside the checkpoints (services/jobs/lag.py): a real-time
    query's checkpoint alone would be up to an epoch old. A record with nothing to apply counts too: the
    tombstone after a delete is its partition's last record, which would otherwise look behind until the
    epoch's end."""
    jobs, pipeline, _ = run
    topic = pipeline.topic("orders")
    before = lag.end_offsets(stack, [topic])[topic]
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        (order,) = conn.execute("INSERT INTO orders (status, total) VALUES ('pending', 1.00) RETURNING id").fetchone()
        conn.execute("DELETE FROM orders WHERE id = %s", (order,))

    def captured_with_its_tombstone() -> dict[int, int]:  # the insert, the delete, the tombstone
        ends = lag.end_offsets(stack, [topic])[topic]
        grown = {p: end for p, end in ends.items() if end > before.get(p, 0)}
        return grown if sum(grown.values()) - sum(before.get(p, 0) for p in grown) >= 3 else {}

    captured = wait_until(captured_with_its_tombstone, CONVERGE_S, "the new order, its delete and tombstone captured")
    checkpoints = {sink: driver.job_settings(jobs).checkpoint_dir / sink for sink in jobs.job_realtime_sinks}
    assert set(checkpoints) == {"search", "cache"}

    def published_past_the_order():
        applied = lag.applied_offsets(stack, checkpoints)
        return all(applied[sink].get(topic, {}).get(p, 0) >= end for sink in checkpoints for p, end in captured.items())

    wait_until(published_past_the_order, CONVERGE_S, "search and cache publishing the tombstone as applied")


def test_the_driver_log_says_every_minute_how_long_the_writers_steps_took(run):
    """docs/apply.md, "Writer times": where a change's time goes between Kafka and the store."""
    jobs, _, _ = run
    log = runner.log_file(jobs, driver.SERVICE)
    line = wait_until(lambda: next((line for line in log.read_text().splitlines() if "writer times over" in line
                                    and "elasticsearch _bulk" in line), None), 120, "a writer times line")
    for step in ("apply:cache wait", "apply:cache ship", "apply:search wait", "apply:search ship",
                 "elasticsearch _mget", "elasticsearch written to searchable"):
        assert f"{step} n=" in line, line


def test_a_driver_whose_jvm_dies_is_started_again_by_itself_loses_nothing_and_never_goes_back_a_version(run, stack):
    """An OutOfMemoryError, a crash or a kill -9 ends the driver's JVM mid-batch under writes: the keep-alive
    starts the driver again with no `tide jobs start`, every sink resumes from its checkpoint (a batch
    written but not committed is applied again), and no row goes back to an older version."""
    jobs, pipeline, _ = run
    before = redis_versions(jobs, "orders")
    keeper = process.read_pid_file(runner.pid_file(jobs, driver.SERVICE))
    writer = Workload(stack, seed=13)
    writer.start()
    wait_until(lambda: writer.done >= 100, 60, "writes before the kill")
    killed = _driver_jvms(keeper.pid)  # one per driver (spark_jobs/runtime/drivers.py)
    assert killed
    for jvm in killed:
        os.kill(jvm, signal.SIGKILL)
    wait_until(lambda: writer.done >= 300, 60, "writes while the drivers are down")
    writer.finish()
    wait_until(lambda: len(_driver_jvms(keeper.pid) - killed) == len(killed), 120, "a new JVM for each driver")
    converged(jobs, pipeline)
    assert process.is_running(keeper)  # the same keep-alive process: nobody ran `tide jobs start`
    after = redis_versions(jobs, "orders", count=10_000)
    regressed = {key: (old, after[key]) for key, old in before.items() if key in after and after[key] < old}
    assert regressed == {}


def _driver_jvms(keeper_pid: int) -> set[int]:
    """The Spark JVMs under the keep-alive (its grandchildren, each launched by a Python driver)."""
    tree = measure.children_by_parent()
    return {pid for pid in measure.process_tree(keeper_pid, tree)
            if Path(f"/proc/{pid}/exe").exists() and Path(f"/proc/{pid}/exe").resolve().name == "java"}


def test_deleted_row_is_not_resurrected_by_a_replayed_older_change(run, stack):
    jobs, pipeline, _ = run
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        key = conn.execute(
            "INSERT INTO customers (email, name) VALUES (%s, 'ghost') RETURNING id", (f"{uuid.uuid4().hex}@ghost.test",)
        ).fetchone()[0]
    topic = pipeline.topic("customers")
    create = wait_until(
        lambda: next((r for r in read_topic(stack, topic) if r.value and json.loads(r.value)["op"] == "c"
                      and json.loads(r.key) == {"id": key}), None),
        60, "the create record",
    )
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        conn.execute("DELETE FROM customers WHERE id = %s", (key,))
    converged(jobs, pipeline, tables=["customers"])

    producer = KafkaProducer(bootstrap_servers=stack.kafka_bootstrap)
    replayed = producer.send(topic, key=create.key, value=create.value, partition=create.partition).get(timeout=30)
    producer.close()
    wait_until(lambda: _all_sinks_past(jobs, pipeline, topic, create.partition, replayed.offset), 120,
               "every sink past the replay")
    assert _clean(jobs, pipeline, tables=["customers"])
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    assert not cache.exists(f"customers:{row_id([key])}")


def test_a_row_deleted_re_inserted_and_moved_to_a_new_key_keeps_its_re_inserted_toasted_description(run, stack):
    """Found by a row-by-row comparison after a concurrent workload: the search view kept the TOASTed
    description from before the delete. The move's create carries the description as unchanged-TOAST,
    so each view must take it from the old key as it was just before the move."""
    jobs, pipeline, _ = run
    rnd = random.Random(33)
    first, second = description(rnd), description(rnd)
    sku = f"move-{uuid.uuid4().hex}"
    with psycopg.connect(postgres.conninfo(stack)) as conn:
        key = conn.execute("INSERT INTO products (sku, name, description, price) VALUES (%s, 'moved', %s, 1) "
                           "RETURNING id", (sku, first)).fetchone()[0]
        conn.commit()
        wait_until(lambda: _searched(stack, pipeline, key).get("description") == first, CONVERGE_S,
                   "the first description in the search view")
        conn.execute("DELETE FROM products WHERE id = %s", (key,))
        conn.execute("INSERT INTO products (id, sku, name, description, price) VALUES (%s, %s, 'moved', %s, 1)",
                     (key, sku, second))
        conn.commit()
        moved = conn.execute("SELECT max(id) + 1000000 FROM products").fetchone()[0]
        conn.execute("UPDATE products SET id = %s WHERE id = %s", (moved, key))
        conn.commit()
    converged(jobs, pipeline, tables=["products"])
    assert _searched(stack, pipeline, moved)["description"] == second


def _searched(stack: StackSettings, pipeline: PipelineConfig, key: int) -> dict:
    """The products search document of `key` ({} when there is none)."""
    index = pipeline.tables["products"].search.index
    found = httpx.get(f"http://{stack.host}:{stack.elasticsearch_port}/{index}/_doc/{key}").json()
    return found.get("_source") or {}


def _all_sinks_past(jobs: StackSettings, pipeline: PipelineConfig, topic: str, partition: int, offset: int) -> bool:
    """Every sink reading `topic` has applied past `offset`: its checkpoint, or what a real-time query's
    writers published (its checkpoint moves only at the end of an epoch, minutes apart)."""
    sinks = [sink for sink in SINKS if topic in {pipeline.topic(t) for t in pipeline.sink_tables(sink)}]
    positions = lag.sink_positions(jobs, sinks).values()
    return all(applied.get(topic, {}).get(partition, 0) > offset for applied in positions)


def test_truncate_empties_the_view_in_every_sink(run, stack):
    jobs, pipeline, _ = run
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM order_items").fetchone()[0] > 0
        conn.execute("TRUNCATE order_items")
    converged(jobs, pipeline, tables=["order_items"])


def test_a_new_column_reaches_every_sink_without_a_restart(run, stack):
    jobs, pipeline, _ = run
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        conn.execute("ALTER TABLE customers ADD COLUMN IF NOT EXISTS loyalty_tier text")
        key = conn.execute("UPDATE customers SET loyalty_tier = 'gold' WHERE id = (SELECT min(id) FROM customers) "
                           "RETURNING id").fetchone()[0]
    try:
        cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
        wait_until(lambda: cache.hget(f"customers:{key}", "loyalty_tier") == b"gold", 90, "loyalty_tier in Redis")
        converged(jobs, pipeline, tables=["customers"])
    finally:
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
            conn.execute("UPDATE customers SET loyalty_tier = NULL WHERE loyalty_tier IS NOT NULL")


def test_malformed_message_goes_to_the_dead_letter_topic_and_later_changes_still_apply(run, stack):
    jobs, pipeline, _ = run
    letters = dead_lettered_by_every_sink(stack, pipeline.topic("customers"), b'{"id": -1}',
                                          b"{this is not json", "malformed record")
    assert "not JSON" in letters[0]["reason"]
    status = [[cell.strip() for cell in line.split("│")[1:-1]] for line in tide(jobs, "jobs", "status").splitlines()]
    dead_letters_by_sink = {row[0]: int(row[3]) for row in status if row and row[0] in SINKS}
    assert dead_letters_by_sink.keys() == set(SINKS) and min(dead_letters_by_sink.values()) >= 1, status
    assert letters[0]["value"] == "{this is not json"


def test_corrupted_sinks_are_repaired_by_a_re_snapshot(run, stack):
    jobs, pipeline, _ = run
    converged(jobs, pipeline, tables=["products"])
    with psycopg.connect(postgres.conninfo(stack)) as conn:
        key = conn.execute("SELECT min(id) FROM products").fetchone()[0]
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    cache.hset(f"products:{key}", "name", json.dumps("corrupted by hand"))
    httpx.delete(f"http://{stack.host}:{stack.elasticsearch_port}/{pipeline.tables['products'].search.index}/_doc/{key}",
                 params={"refresh": "true"}).raise_for_status()
    DeltaTable(str(jobs.state_dir / "warehouse" / "products")).delete(f"id = {key}")
    assert not _clean(jobs, pipeline, tables=["products"])
    snapshot.run(stack, pipeline, "products", None, 180.0, lambda progress: None)
    converged(jobs, pipeline, tables=["products"])


def test_stopping_elasticsearch_leaves_redis_and_delta_fresh_and_search_catches_up(run, stack):
    """Elasticsearch down for a minute under load: every new row still reaches Redis and Delta."""
    jobs, pipeline, _ = run
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    warehouse = str(jobs.state_dir / "warehouse" / "customers")
    writer = Workload(stack, seed=14)
    writer.start()
    runner.down(stack, ["elasticsearch"])
    try:
        down_since, applied = time.monotonic(), 0
        while time.monotonic() - down_since < ES_DOWN_S:  # the outage lasts a minute, proven fresh throughout
            with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
                key = conn.execute("INSERT INTO customers (email, name) VALUES (%s, 'while es down') RETURNING id",
                                   (f"{uuid.uuid4().hex}@esdown.test",)).fetchone()[0]
            # wait_until calls each check before the next iteration rebinds `key`
            wait_until(lambda: cache.exists(f"customers:{key}"),  # noqa: B023
                       60, "Redis to apply while Elasticsearch is down")
            wait_until(lambda: _warehouse_count(warehouse, f"id = {key}") == 1,  # noqa: B023
                       90, "Delta to apply while Elasticsearch is down")
            applied += 1
        assert applied >= 2
    finally:
        runner.up(stack, ["elasticsearch"])
        writer.finish()  # also on failure: a writer left running would load every later test
    # Redis and Delta were proven fresh row by row above; what is left to show is search catching up.
    converged(jobs, pipeline, sinks=["search"])


def _warehouse_count(path: str, where: str) -> int:
    table = QueryBuilder().register("t", DeltaTable(path))
    return table.execute(f"SELECT count(*) AS n FROM t WHERE {where}").read_all().column("n").to_pylist()[0]


def _alias_targets(settings: StackSettings, pipeline: PipelineConfig) -> dict[str, list[str]]:
    url = f"http://{settings.host}:{settings.elasticsearch_port}"
    aliases = [views.search.index for views in pipeline.tables.values() if views.search is not None]
    aliases += list(pipeline.nested)
    return {alias: sorted(httpx.get(f"{url}/_alias/{alias}").raise_for_status().json()) for alias in aliases}


def test_tide_rebuild_search_moves_every_alias_to_a_new_complete_index(run):
    jobs, pipeline, _ = run
    # Search's own: the other sinks' queries neither take part in nor notice a search rebuild.
    converged(jobs, pipeline, sinks=["search"])
    before = _alias_targets(jobs, pipeline)
    tide(jobs, "rebuild", "search")
    after = _alias_targets(jobs, pipeline)
    for alias, indices in after.items():
        assert len(indices) == 1 and indices != before[alias], f"{alias} still points at {before[alias]}"
        assert indices[0].startswith(f"{alias}-v")
    converged(jobs, pipeline, sinks=["search"])  # verify reads through the aliases: the new indices are complete


def _indexed(settings: StackSettings, alias: str) -> int:
    """Documents Elasticsearch indexed behind `alias` so far (its indexing stats: writes, not no-ops)."""
    url = f"http://{settings.host}:{settings.elasticsearch_port}"
    stats = httpx.get(f"{url}/{alias}/_stats/indexing").raise_for_status().json()["indices"]
    return sum(index["primaries"]["indexing"]["index_total"] for index in stats.values())


def _count(settings: StackSettings, alias: str, query: dict) -> int:
    url = f"http://{settings.host}:{settings.elasticsearch_port}"
    httpx.post(f"{url}/{alias}/_refresh").raise_for_status()
    return httpx.post(f"{url}/{alias}/_count", json={"query": query}).raise_for_status().json()["count"]


def test_renaming_a_customer_with_1000_orders_rewrites_exactly_those_1000_documents(run, stack):
    jobs, pipeline, writer = run
    writer.finish()
    view = next(iter(pipeline.nested))
    name = f"buyer-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        (customer,) = conn.execute("INSERT INTO customers (email, name, country) VALUES (%s, %s, 'NL') RETURNING id",
                                   (f"{name}@example.com", name)).fetchone()
        conn.execute("INSERT INTO orders (customer_id, status, total) "
                     "SELECT %s, 'pending', 1.00 FROM generate_series(1, 1000)", (customer,))
    mine = {"term": {"customer.id": customer}}
    wait_until(lambda: _count(jobs, view, mine) == 1000, CONVERGE_S, "the customer's 1000 orders in the nested view")
    # The nested view is search's: the Delta queries' progress says nothing about its documents.
    caught_up(jobs, pipeline, CONVERGE_S, sinks=["search"])
    before = _indexed(jobs, view)
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        conn.execute("UPDATE customers SET name = %s WHERE id = %s", (f"{name}-renamed", customer))
    renamed = {"match_phrase": {"customer.name": f"{name}-renamed"}}
    wait_until(lambda: _count(jobs, view, renamed) == 1000, CONVERGE_S, "the rename in all 1000 documents")
    caught_up(jobs, pipeline, CONVERGE_S, sinks=["search"])
    assert _indexed(jobs, view) - before == 1000
    converged(jobs, pipeline, tables=["orders"], sinks=["search"])
