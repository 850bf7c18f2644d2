"""The first transaction streamed after a new slot's snapshot: one begun before the slot was consistent
and committed after it must outrank the row's snapshot record."""

from __future__ import annotations

import json
import threading
import uuid

import psycopg
import pytest

from services.capture.connector import registration
from services.db import migrate
from services.settings import StackSettings
from services.stack import postgres
from spark_jobs.changes import Change
from tests.capture_support import Record, changes, customers_only
from tests.waiting import wait_until

pytestmark = pytest.mark.stack


def _xid(conn: psycopg.Connection) -> int:
    """This transaction's id as pg_locks shows it (32 bits)."""
    return conn.execute("SELECT txid_current() % 4294967296").fetchone()[0]


def _slot_waits_for(settings: StackSettings, slot: str, xid: int) -> bool:
    """Is the walsender creating `slot` waiting for transaction `xid` to end (building its snapshot)?"""
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        return conn.execute(
            "SELECT 1 FROM pg_locks l JOIN pg_replication_slots s ON l.pid = s.active_pid "
            "WHERE s.slot_name = %s AND l.locktype = 'transactionid' AND NOT l.granted "
            "AND l.transactionid::text = %s::text", (slot, xid)
        ).fetchone() is not None


def _slot_consistent(settings: StackSettings, slot: str) -> bool:
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        return conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND confirmed_flush_lsn IS NOT NULL", (slot,)
        ).fetchone() is not None


def _update_straddling_the_slot(stack: StackSettings, key: int, name: str) -> tuple[Change, Change, list | None]:
    """Register a connector while a transaction updates customer `key` before the new slot is consistent
    and commits right after it; the row's snapshot record, the update, and the update's raw sequence."""
    pipeline = customers_only(stack)
    slot, topic = pipeline.source.slot, pipeline.topic("customers")
    holders = [psycopg.connect(postgres.conninfo(stack)) for _ in range(3)]
    first, second, late = holders
    registering = threading.Thread(target=registration.apply, args=(stack, pipeline, 180.0), daemon=True)
    try:
        # The slot's snapshot builder waits for the transactions running when it starts (first), then
        # for those running once they ended (second); it is consistent when second ends.
        first_xid = _xid(first)
        registering.start()
        wait_until(lambda: _slot_waits_for(stack, slot, first_xid), 120, "the new slot to wait for a transaction")
        second_xid = _xid(second)
        first.commit()
        wait_until(lambda: _slot_waits_for(stack, slot, second_xid), 60, "the slot to wait for the second transaction")
        late.execute("UPDATE customers SET name = %s WHERE id = %s", (name, key))
        second.commit()
        wait_until(lambda: _slot_consistent(stack, slot), 60, "the slot to be consistent", interval=0.02)
        late.commit()  # at once: the first transaction the slot streams, unless another one commits first
        registering.join(timeout=180)

        def records() -> dict[str, tuple[Record, Change]]:
            return {c.op: (r, c) for r, c in changes(stack, topic) if c is not None and c.key == {"id": key}}

        wait_until(lambda: {"r", "u"} <= records().keys(), 120, "the row's snapshot record and its update")
        (_, snapshot), (raw, update) = records()["r"], records()["u"]
        return snapshot, update, json.loads(json.loads(raw.value)["source"]["sequence"])
    finally:
        for conn in holders:
            conn.close()
        registering.join(timeout=180)
        registration.delete(stack, pipeline, drop_slot=True)


def test_a_transaction_begun_before_the_slot_was_consistent_outranks_the_snapshot(stack):
    """A transaction that writes before the slot's consistent point and commits after it is not in the
    snapshot; if it is the first one streamed, Debezium sends it with no previous commit in its
    source.sequence. Its change must still rank above the row's snapshot record, or every sink keeps
    the snapshot's older value (found by the chaos smoke run: one row stale in every view)."""
    migrate.upgrade(stack)
    marker = f"first{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        key = conn.execute(
            "INSERT INTO customers (email, name, country) VALUES (%s, %s, 'NO') RETURNING id",
            (f"{marker}@first.test", f"{marker}-snapshot"),
        ).fetchone()[0]
    # Another connector's heartbeat may commit first in the ~0.1 s window; then try again.
    for attempt in range(3):
        snapshot, update, raw_sequence = _update_straddling_the_slot(stack, key, f"{marker}-streamed{attempt}")
        if raw_sequence[0] is None:
            break
    assert raw_sequence[0] is None, "another transaction was streamed first in every attempt"
    assert update.after["name"] == f"{marker}-streamed{attempt}" != snapshot.after["name"]
    assert update.lsn < int(snapshot.lsn), "the update was not written below the snapshot's point"
    assert update.sequence > snapshot.sequence
