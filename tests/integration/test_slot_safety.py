"""Slot safety against the real stack: a replication slot that PostgreSQL invalidates
(`max_slot_wal_keep_size`) is reported by the status and refused by `tide connector apply` and
`restart`, never resumed with a gap; a re-snapshot (delete --drop-slot, apply) recovers it.

The module's connector and slot are its own (other modules share the stack). The WAL cap is
lowered only for the one checkpoint that invalidates the slot, after every other active slot has
caught up, and set back at once (docs/reliability.md, Slot safety).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from typer.testing import CliRunner

from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectApi
from services.cli import app
from services.db import migrate
from services.settings import StackSettings
from services.stack import kafka, postgres
from services.stack.service import StackError
from services.status.collect import collect
from services.status.figures import to_json
from spark_jobs.model.config import PipelineConfig, load
from tests.capture_support import changes, unique_pipeline
from tests.tide_cli import pipeline_env
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

SEGMENT = 16 * 1024 * 1024  # PostgreSQL's WAL segment size (initdb's default)
LOWERED_KEEP = "32MB"  # two segments: a slot four segments behind is past it, one caught up is not


@pytest.fixture(scope="module")
def pipeline(stack: StackSettings) -> Iterator[PipelineConfig]:
    """A connector and slot of the module's own."""
    migrate.upgrade(stack)
    config = unique_pipeline(load(stack.pipeline_file), "slot")
    registration.apply(stack, config)
    yield config
    registration.delete(stack, config, drop_slot=True)


@pytest.fixture(scope="module")
def cli_env(pipeline: PipelineConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return pipeline_env(pipeline, tmp_path_factory.mktemp("slot-pipeline"))


def _owner(stack: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(stack), autocommit=True)


def _slot(stack: StackSettings, slot: str) -> registration.SlotState | None:
    return registration.slot_state(stack, slot)


def _set_keep_size(conn: psycopg.Connection, value: str) -> None:
    conn.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{value}'")
    conn.execute("SELECT pg_reload_conf()")
    wait_until(lambda: conn.execute("SHOW max_slot_wal_keep_size").fetchone()[0] == value, 30,
               f"max_slot_wal_keep_size = {value} after the reload")


def _others_caught_up(conn: psycopg.Connection, slot: str) -> bool:
    """Every other active slot within one segment of the current WAL position (safe from the cap)."""
    behind = conn.execute(
        """SELECT slot_name FROM pg_replication_slots WHERE slot_name <> %s AND active
           AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > %s""", (slot, SEGMENT)).fetchall()
    return not behind


def _invalidate(stack: StackSettings, slot: str) -> None:
    """Push the inactive slot four segments behind, then checkpoint under a lowered cap until it is lost."""
    with _owner(stack) as conn:
        for _ in range(4):
            conn.execute("SELECT pg_logical_emit_message(false, 'tideline-test', 'wal')")  # a switch needs new WAL
            conn.execute("SELECT pg_switch_wal()")
        wait_until(lambda: _others_caught_up(conn, slot), 120, "every other active slot to catch up")
        try:
            _set_keep_size(conn, LOWERED_KEEP)
            # The checkpointer takes the lowered cap at its own reload, not this session's: a checkpoint
            # that ran before that (or one already running) keeps the slot. Checkpoint until one drops it.
            wait_until(lambda: _checkpoint_lost(conn, slot), 60,
                       "a checkpoint under the lowered cap to invalidate the slot",
                       interval=1)
        finally:
            _set_keep_size(conn, stack.postgres_max_slot_wal_keep_size)


def _checkpoint_lost(conn: psycopg.Connection, slot: str) -> bool:
    conn.execute("CHECKPOINT")
    found = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return found[0] == "lost"


def _insert_product(stack: StackSettings, name: str) -> int:
    with _owner(stack) as conn:
        return conn.execute("INSERT INTO products (sku, name, price) VALUES (%s, %s, 1.00) RETURNING id",
                            (f"SLOT-{uuid.uuid4().hex[:8]}", name)).fetchone()[0]


def test_an_invalidated_slot_is_reported_refused_and_recovered_by_a_re_snapshot(stack, pipeline, cli_env):
    source = pipeline.source
    with ConnectApi(kafka.connect_url(stack)) as api:
        api.stop(source.connector)  # the connector stays registered, with its offsets, as after an outage
        wait_until(lambda: _slot(stack, source.slot) and not _slot(stack, source.slot).active, 60,
                   "the slot released by the stopped connector")
    missed = _insert_product(stack, "written while the slot was being invalidated")
    _invalidate(stack, source.slot)
    assert _slot(stack, source.slot).wal_status == "lost"

    document = to_json(collect(stack, pipeline))
    assert document["source"]["slot_wal_status"] == "lost"
    (warning,) = document["warnings"]
    assert source.slot in warning and "invalidated" in warning and "tide connector delete --drop-slot" in warning
    status = CliRunner().invoke(app, ["status"], env=cli_env)
    assert "lost" in status.output and "warning:" in status.output and "invalidated" in status.output, status.output

    with pytest.raises(StackError, match="invalidated"):
        registration.apply(stack, pipeline)
    for command in (["connector", "apply"], ["connector", "restart"]):
        refused = CliRunner().invoke(app, command, env=cli_env)
        lines = refused.output.strip().splitlines()
        assert refused.exit_code == 1 and len(lines) == 1, refused.output
        assert "invalidated" in lines[0] and "tide connector delete --drop-slot" in lines[0], lines[0]
    with ConnectApi(kafka.connect_url(stack)) as api:
        assert api.status(source.connector)["connector"]["state"] == "STOPPED", "nothing was restarted"

    registration.delete(stack, pipeline, drop_slot=True)
    registration.apply(stack, pipeline)
    assert _slot(stack, source.slot).wal_status in ("reserved", "extended")

    def re_read() -> bool:
        return any(change is not None and change.op == "r" and change.key == {"id": missed}
                   for _, change in changes(stack, pipeline.topic("products")))

    wait_until(re_read, 120, "the row written during the gap, re-read by the new snapshot")
    assert to_json(collect(stack, pipeline))["warnings"] == []


def test_a_slot_dropped_under_a_connector_with_offsets_is_refused(stack, pipeline):
    """Debezium would create a new slot at the current WAL position and skip what happened in between."""
    source = pipeline.source
    with ConnectApi(kafka.connect_url(stack)) as api:
        wait_until(lambda: api.offsets(source.connector), 60, "the connector to commit an offset")
        api.stop(source.connector)
    wait_until(lambda: not _slot(stack, source.slot).active, 60, "the slot released")
    with _owner(stack) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))
    with pytest.raises(StackError, match=r"is gone but connector .* still has an offset"):
        registration.apply(stack, pipeline)
