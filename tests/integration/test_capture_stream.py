"""Capture under concurrent writes (one connector registered for the module while a writer runs):
snapshot aligned to the slot, then the stream, nothing lost; the events each change makes."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from psycopg.rows import dict_row

from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectApi
from services.db import migrate
from services.settings import StackSettings
from services.stack import kafka, postgres, process, runner
from services.verify import readers
from services.verify.canonical import Canonicaliser
from spark_jobs.changes.envelope import UNAVAILABLE
from spark_jobs.model.config import PipelineConfig, load
from tests.capture_support import as_values, changes, fold, key_of, read_topic, registered, unique_pipeline
from tests.capture_writer import History, Writer
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

BURST_CAP = 3000
BIG_TEXT_SQL = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 1200) g)"


@dataclass(frozen=True)
class Capture:
    settings: StackSettings
    pipeline: PipelineConfig
    marker: str
    history: History
    seed_keys: set[int]


# Registered after the seed rows exist and while the writer runs, so the snapshot is taken under concurrent
# writes. Rows carry a per-run marker so other tests sharing the database do not interfere.
@pytest.fixture(scope="module")
def capture(stack: StackSettings):
    migrate.upgrade(stack)
    pipeline = unique_pipeline(load(stack.pipeline_file), "cap")
    marker = f"m{uuid.uuid4().hex[:8]}"
    history = History()
    seed_keys: set[int] = set()
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        for i in range(20):
            key = conn.execute(
                "INSERT INTO customers (email, name, country) VALUES (%s, %s, 'FR') RETURNING id",
                (f"seed{i}@seed-{marker}.test", f"{marker}-v0"),
            ).fetchone()[0]
            history.record(key, f"{marker}-v0")
            seed_keys.add(key)
        for i in range(5):
            conn.execute(
                f"INSERT INTO products (sku, name, description, price, tags, attributes) "
                f"VALUES (%s, %s, {BIG_TEXT_SQL}, 9.99, ARRAY['seed'], %s)",
                (f"{marker}-{i}", f"product {i}", json.dumps({"seed": i, "nested": {"ok": True}})),
            )
    writer = Writer(stack, marker, history, seed=7)
    writer.versions.update(dict.fromkeys(history.states, 0))
    writer.undeletable |= seed_keys
    writer.start()
    try:
        registration.apply(stack, pipeline)
        # Keep writing while the snapshot runs and for a while after streaming started.
        wait_until(lambda: len(history.states) > 60, timeout=120, reason="the writer to create 40+ customers")
    finally:
        writer.stop.set()
        writer.join(timeout=30)
    assert writer.error is None, writer.error
    yield Capture(stack, pipeline, marker, history, seed_keys)
    registration.delete(stack, pipeline, drop_slot=True)


def _pg_rows(settings: StackSettings, sql: str, params: tuple) -> dict[tuple, dict]:
    with psycopg.connect(postgres.conninfo(settings), row_factory=dict_row) as conn:
        rows = conn.execute(sql, params).fetchall()
    keys = ("order_id", "line_no") if rows and "line_no" in rows[0] else ("id",)
    return {tuple(sorted((k, row[k]) for k in keys)): row for row in rows}


def _our_rows(settings: StackSettings, marker: str) -> dict[str, dict[tuple, dict]]:
    like = f"%{marker}%"
    return {
        "customers": _pg_rows(settings, "SELECT * FROM customers WHERE email LIKE %s", (like,)),
        "products": _pg_rows(settings, "SELECT * FROM products WHERE sku LIKE %s", (like,)),
        "orders": _pg_rows(
            settings, "SELECT o.* FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.email LIKE %s", (like,)
        ),
        "order_items": _pg_rows(
            settings,
            "SELECT i.* FROM order_items i JOIN orders o ON o.id = i.order_id "
            "JOIN customers c ON c.id = o.customer_id WHERE c.email LIKE %s",
            (like,),
        ),
    }


def _topics_match_postgres(settings: StackSettings, pipeline, marker: str) -> bool:
    """Every row of the run equals, as verify compares values, the newest record of its key."""
    expected = _our_rows(settings, marker)
    with readers.connect_source(postgres.conninfo(settings)) as conn:
        shapes = {table: readers.source_shape(conn, pipeline.source.schema_name, table, [])[0] for table in expected}
    for table, rows in expected.items():
        canon, folded = Canonicaliser(shapes[table]), fold(changes(settings, pipeline.topic(table)))
        if any(folded.get(key) is None or canon.digest(as_values(shapes[table], folded[key])) != canon.digest(row)
               for key, row in rows.items()):
            return False
    return True


def test_rows_present_before_registration_arrive_as_snapshot_reads(capture):
    def snapshot_keys() -> set[int]:
        return {
            change.key["id"]
            for _, change in changes(capture.settings, capture.pipeline.topic("customers"))
            if change is not None and change.op == "r"
        }

    wait_until(lambda: capture.seed_keys <= snapshot_keys(), 60, "every seed row as a snapshot read")


def test_latest_record_per_key_equals_postgres_for_every_table(capture):
    settings, pipeline, marker = capture.settings, capture.pipeline, capture.marker
    wait_until(lambda: _topics_match_postgres(settings, pipeline, marker), 90, "topics to equal PostgreSQL")
    rows = _our_rows(settings, marker)
    assert rows["orders"] and rows["order_items"] and rows["products"], "the writer exercised every table"


def test_snapshot_and_stream_meet_exactly_for_every_key(capture):
    """Per customer: the snapshot record (if any) is one committed state, and the streamed events are
    exactly the states committed after it, in order: no gap, no duplicate."""
    settings, pipeline, marker, history = capture.settings, capture.pipeline, capture.marker, capture.history
    wait_until(lambda: _topics_match_postgres(settings, pipeline, marker), 90, "topics to equal PostgreSQL")
    events: dict[int, list[tuple[str, str | None]]] = {}
    for _record, change in changes(settings, pipeline.topic("customers")):
        if change is None:
            continue
        key = change.key["id"]
        if key in history.states:
            events.setdefault(key, []).append((change.op, None if change.op == "d" else change.after["name"]))
    for key, committed in history.states.items():
        seen = events.get(key, [])
        snapshots = [state for op, state in seen if op == "r"]
        streamed = [state for op, state in seen if op != "r"]
        assert len(snapshots) <= 1, (key, seen)
        if snapshots:
            start = committed.index(snapshots[0]) + 1
        else:
            start = len(committed) - len(streamed)
            assert start == 0 or committed[start - 1] is None, (key, committed, seen)
        assert streamed == committed[start:], (key, committed, seen)


def test_update_leaving_toasted_column_unchanged_is_captured_with_the_placeholder(capture):
    settings, pipeline, marker = capture.settings, capture.pipeline, capture.marker
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        key = conn.execute("UPDATE products SET price = 11.11 WHERE sku = %s RETURNING id",
                           (f"{marker}-0",)).fetchone()[0]

    def the_update():
        for record, change in changes(settings, pipeline.topic("products")):
            if change and change.op == "u" and change.key == {"id": key} and str(change.after["price"]) == "11.11":
                return record, change
        return None

    record, change = wait_until(the_update, 60, "the price update of the TOASTed product")
    raw_after = json.loads(record.value)["after"]  # schemaless records: the envelope itself
    assert raw_after["description"] == UNAVAILABLE  # what the connector emits for the unchanged column
    assert change.unavailable == {"description"} and "description" not in change.after


def test_primary_key_change_is_a_delete_with_tombstone_then_a_create(capture):
    settings, pipeline, marker = capture.settings, capture.pipeline, capture.marker
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        order_id, line_no = conn.execute(
            "SELECT i.order_id, i.line_no FROM order_items i JOIN orders o ON o.id = i.order_id "
            "JOIN customers c ON c.id = o.customer_id WHERE c.email LIKE %s LIMIT 1",
            (f"%{marker}%",),
        ).fetchone()
        conn.execute("UPDATE order_items SET line_no = 99 WHERE order_id = %s AND line_no = %s", (order_id, line_no))
    old, new = {"order_id": order_id, "line_no": line_no}, {"order_id": order_id, "line_no": 99}

    def both_keys():
        decoded = changes(settings, pipeline.topic("order_items"))
        old_events = [("tombstone" if c is None else c.op) for r, c in decoded if dict(key_of(r)) == old]
        new_events = [c.op for r, c in decoded if c is not None and dict(key_of(r)) == new]
        return (old_events, new_events) if old_events[-2:] == ["d", "tombstone"] and new_events == ["c"] else None

    wait_until(both_keys, 60, "delete + tombstone on the old key and create on the new key")


def test_delete_is_a_delete_marker_followed_by_a_tombstone(capture):
    settings, pipeline, marker = capture.settings, capture.pipeline, capture.marker
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        key = conn.execute(
            "INSERT INTO customers (email, name) VALUES (%s, 'to delete') RETURNING id", (f"del@{marker}.test",)
        ).fetchone()[0]
        conn.execute("DELETE FROM customers WHERE id = %s", (key,))

    def events():
        seen = [("tombstone" if c is None else c.op) for r, c in changes(settings, pipeline.topic("customers"))
                if dict(key_of(r)) == {"id": key}]
        return seen if seen == ["c", "d", "tombstone"] else None

    wait_until(events, 60, "create, delete, tombstone for one key")


def test_kill_9_of_connect_mid_burst_loses_no_committed_change(capture):
    settings, pipeline, marker = capture.settings, capture.pipeline, capture.marker
    committed: list[int] = []
    stop = threading.Event()

    def burst():
        with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
            # Capped: every check below reads the whole topic.
            while not stop.is_set() and len(committed) < BURST_CAP:
                committed.append(
                    conn.execute(
                        "INSERT INTO customers (email, name) VALUES (%s, 'burst') RETURNING id",
                        (f"{uuid.uuid4().hex[:10]}@burst-{marker}.test",),
                    ).fetchone()[0]
                )

    thread = threading.Thread(target=burst, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(committed) > 200, 60, "the burst to commit 200 rows")
        connect = process.read_pid_file(runner.pid_file(settings, kafka.CONNECT))
        os.kill(connect.pid, signal.SIGKILL)
        wait_until(lambda: not process.is_running(connect), 30, "the Connect worker to die")
        killed_at = len(committed)
        wait_until(lambda: len(committed) > killed_at + 200, 60, "more commits while Connect is down")
        runner.up(settings, ["connect"])
        with ConnectApi(kafka.connect_url(settings)) as api:
            registration.wait_running(api, pipeline.source.connector, 120)
    finally:
        stop.set()
        thread.join(timeout=30)

    missing: set[int] = set()

    def all_arrived():
        # A kill before the connector's first offset flush (every 10 s) restarts it with a fresh snapshot,
        # where rows committed meanwhile arrive as reads ("r"): present all the same.
        ids = {c.key["id"] for _, c in changes(settings, pipeline.topic("customers")) if c and c.op in ("c", "r")}
        missing.clear()
        missing.update(set(committed) - ids)
        return not missing

    try:
        wait_until(all_arrived, 180, f"all {len(committed)} committed inserts in the topic after the restart")
    except AssertionError as exc:
        # Which commits are missing tells a slow stream (the latest ones) from a gap (a range in the middle).
        first = committed.index(min(missing))
        with ConnectApi(kafka.connect_url(settings)) as api:
            state = api.status(pipeline.source.connector)
        raise AssertionError(f"{exc}: {len(missing)} missing, ids {min(missing)}..{max(missing)}, the first at "
                             f"commit #{first} of {len(committed)} (killed at #{killed_at}); "
                             f"connector: {state}") from None


def test_truncate_is_captured_as_a_keyed_table_event(capture):
    settings, pipeline = capture.settings, capture.pipeline
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        conn.execute("TRUNCATE order_items")

    def truncate_event():
        return [c for _, c in changes(settings, pipeline.topic("order_items")) if c is not None and c.op == "t"]

    events = wait_until(truncate_event, 60, "a truncate event in the order_items topic")
    assert events[-1].table == "order_items" and events[-1].sequence[0] > 0
    records = read_topic(settings, pipeline.topic("order_items"))
    assert all(record.key is not None for record in records)  # a compacted topic accepts keyed records only


def test_delete_with_drop_slot_then_apply_starts_over_with_a_snapshot(capture):
    """The documented recovery for an invalidated slot: no resume from a position that is gone."""
    settings, pipeline = capture.settings, capture.pipeline

    def snapshot_reads() -> int:
        return sum(
            1 for _, c in changes(settings, pipeline.topic("customers"))
            if c is not None and c.op == "r" and c.key["id"] in capture.seed_keys
        )

    before = snapshot_reads()
    registration.delete(settings, pipeline, drop_slot=True)
    assert not registered(settings, pipeline.source.connector)
    registration.apply(settings, pipeline)
    wait_until(lambda: snapshot_reads() >= before + len(capture.seed_keys), 180, "a second snapshot of the seed rows")
