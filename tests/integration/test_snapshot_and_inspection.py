"""`tide snapshot`, `tide topics` and `tide tail` against the shared test stack.

The module registers its own connector (unique name, slot and topic prefix)
and works on its own products (a unique sku prefix), because other test
modules use the same stack at the same time. What it proves:

- an incremental snapshot re-emits every product while a writer keeps
  inserting and updating, and afterwards the latest record per key in the
  topic equals the current row for every product (nothing lost, nothing stale);
- `--where` limits the re-emitted rows to the filter;
- a refused request (unknown table, a filter that is not one expression)
  writes no signal row;
- `tide topics` counts the products topic, `tide tail` prints events.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import yaml
from kafka import TopicPartition
from typer.testing import CliRunner

from services.capture import objects
from services.capture.connector import registration, snapshot, snapshot_watch, topics
from services.cli import app
from services.db import migrate
from services.settings import StackSettings
from services.stack import postgres
from services.stack.service import StackError
from spark_jobs.changes import Change, decode, decode_key
from spark_jobs.model.config import PipelineConfig
from tests.conftest import TEST_STACK
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

RUN = uuid.uuid4().hex[:8]
SKU = f"SNAP-{RUN}-"
SEED_ROWS = 400

Row = tuple[str, str, str]  # sku, name, price as text: what the topic must match


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pipeline(stack: StackSettings) -> Iterator[PipelineConfig]:
    """pipeline.yaml with this module's own connector, slot and topic prefix, registered and past its
    initial snapshot."""
    migrate.upgrade(stack)
    base = objects.load_pipeline(stack)
    source = base.source.model_copy(
        update={"connector": f"test-snap-{RUN}", "slot": f"test_snap_{RUN}", "topic_prefix": f"testsnap_{RUN}"}
    )
    config = base.model_copy(update={"source": source})
    _seed(stack)
    registration.apply(stack, config)
    # The notifications topic appears with the initial snapshot's notifications; `tide snapshot` needs it.
    wait_until(lambda: _initial_snapshot_completed(stack, config), timeout=120,
               reason="the initial snapshot to complete")
    yield config
    registration.delete(stack, config, drop_slot=True)


@pytest.fixture(scope="module")
def cli_env(pipeline: PipelineConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment that points `tide` at the test stack and this module's pipeline file."""
    path: Path = tmp_path_factory.mktemp("snapshot-pipeline") / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, mode="json")))
    env = {f"TIDE_{name.upper()}": str(value) for name, value in TEST_STACK.items()}
    return {**env, "TIDE_PIPELINE_FILE": str(path)}


def _owner(settings: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(settings), autocommit=True)


def _seed(settings: StackSettings) -> None:
    with _owner(settings) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO products (sku, name, price) VALUES (%s, %s, %s)",
            [(f"{SKU}{i}", f"seed {i}", Decimal(i % 20) + Decimal("0.50")) for i in range(SEED_ROWS)],
        )


def _initial_snapshot_completed(settings: StackSettings, config: PipelineConfig) -> bool:
    consumer = topics.open_consumer(settings)
    try:
        parts = topics.partitions(consumer, topics.notifications_topic(config))
        if not parts:
            return False
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        for records in consumer.poll(timeout_ms=1000, max_records=10_000).values():
            for record in records:
                note = snapshot_watch.parse_notification(record.value)
                if note and note.aggregate_type == "Initial Snapshot" and note.type == "COMPLETED":
                    return True
        return False
    finally:
        consumer.close()


def _current_products(settings: StackSettings, sku_prefix: str = "") -> dict[int, Row]:
    with _owner(settings) as conn:
        rows = conn.execute(
            "SELECT id, sku, name, price::text FROM products WHERE sku LIKE %s", (f"{sku_prefix}%",)
        ).fetchall()
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def _signal_rows_mentioning(settings: StackSettings, text: str) -> int:
    with _owner(settings) as conn:
        return conn.execute("SELECT count(*) FROM debezium_signal WHERE data LIKE %s", (f"%{text}%",)).fetchone()[0]


# ---------------------------------------------------------------- reading the topic


class TopicReader:
    """Reads a change topic from given offsets, keeping what it has read between polls."""

    def __init__(self, settings: StackSettings, topic: str, start: dict[TopicPartition, int] | None = None) -> None:
        self.topic = topic
        self.consumer = topics.open_consumer(settings)
        parts = topics.partitions(self.consumer, topic)
        self.consumer.assign(parts)
        for part in parts:
            if start is None:
                self.consumer.seek_to_beginning(part)
            else:
                self.consumer.seek(part, start.get(part, 0))
        self.records: list[tuple[dict, Change | None]] = []  # (key, change or None for a tombstone), in read order

    def read_to_end(self) -> list[tuple[dict, Change | None]]:
        end = topics.end_offsets(self.consumer, self.topic)
        while any(self.consumer.position(tp) < offset for tp, offset in end.items()):
            for records in self.consumer.poll(timeout_ms=500).values():
                for record in records:
                    change = decode(self.topic, record.key, record.value)
                    key = change.key if change else decode_key(record.key)
                    self.records.append((key, change))
        return self.records

    def close(self) -> None:
        self.consumer.close()


def _latest_rows(records: list[tuple[dict, Change | None]]) -> dict[int, Row]:
    """The state the topic describes: latest record per key (a delete or tombstone removes it; a truncate clears all).

    Per-key order is partition order, which is read order within a partition;
    keys never move between partitions, so read order per key is enough.
    """
    state: dict[int, Row] = {}
    for key, change in records:
        if change is not None and change.op == "t":
            state.clear()
        elif change is None or change.op == "d":
            state.pop(key["id"], None)
        else:
            after = change.after
            state[key["id"]] = (after["sku"], after["name"], str(after["price"]))
    return state


# ---------------------------------------------------------------- a concurrent writer


class Writer(threading.Thread):
    """Inserts new products and updates seeded ones until stopped: the streaming side of the race."""

    def __init__(self, settings: StackSettings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with _owner(self.settings) as conn:
                while not self.stop.is_set():
                    conn.execute(
                        "INSERT INTO products (sku, name, price) VALUES (%s, 'written during snapshot', 12.34)",
                        (f"{SKU}w{self.writes}",),
                    )
                    conn.execute(
                        "UPDATE products SET price = price + 1, name = name || '+' WHERE sku = %s",
                        (f"{SKU}{self.writes % SEED_ROWS}",),
                    )
                    self.writes += 1
                    self.stop.wait(0.01)  # pacing, not synchronisation: spread writes over the snapshot
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test after join()
            self.error = exc

    def finish(self) -> int:
        self.stop.set()
        self.join(timeout=30)
        if self.error:
            raise self.error
        return self.writes


# ---------------------------------------------------------------- tests


def test_snapshot_reemits_every_product_while_a_writer_keeps_writing(stack: StackSettings, pipeline: PipelineConfig):
    topic = pipeline.topic("products")
    reader_start = _end_offsets(stack, topic)
    before = _current_products(stack)
    writer = Writer(stack)
    writer.start()
    emitted_so_far: list[int] = []
    try:
        result = snapshot.run(
            stack, pipeline, "products", timeout_s=300, on_progress=lambda p: emitted_so_far.append(p.emitted)
        )
        writes_during = writer.writes
    finally:
        writer.finish()
    assert result.completed and result.delivered and result.table == "public.products"
    assert writes_during > 0, "the writer must have written while the snapshot ran"
    assert result.seen[0] == "STARTED" and result.seen[-1] == "COMPLETED", result.seen
    assert "TABLE_SCAN_COMPLETED" in result.seen
    assert emitted_so_far == sorted(emitted_so_far) and emitted_so_far[-1] == result.emitted

    reader = TopicReader(stack, topic, reader_start)
    try:
        def every_existing_product_reemitted() -> bool:
            records = reader.read_to_end()
            reread = {key["id"] for key, change in records if change is not None and change.op == "r"}
            # Debezium drops a chunk row whose key was written inside the chunk's window (the
            # streamed change is newer), so a key written since the signal may carry that change instead.
            written = {key["id"] for key, change in records if change is None or change.op != "r"}
            still_there = set(before) & set(_current_products(stack))
            return not still_there - reread - written

        wait_until(every_existing_product_reemitted, timeout=120, reason="an op=r record for every existing product")
        # Delivery was confirmed before run() returned: its count is every op=r record, none missed.
        assert result.emitted == sum(1 for _, change in reader.read_to_end() if change is not None and change.op == "r")
    finally:
        reader.close()

    _assert_topic_matches_table(stack, topic)


def _end_offsets(settings: StackSettings, topic: str) -> dict[TopicPartition, int]:
    consumer = topics.open_consumer(settings)
    try:
        return topics.end_offsets(consumer, topic)
    finally:
        consumer.close()


def _assert_topic_matches_table(settings: StackSettings, topic: str) -> None:
    """Latest record per key == current row, for every product (other modules may still be writing: poll)."""
    reader = TopicReader(settings, topic)
    try:
        def same() -> bool:
            return _latest_rows(reader.read_to_end()) == _current_products(settings)

        wait_until(same, timeout=120, reason="the products topic's latest record per key to equal the products table")
    finally:
        reader.close()


def test_cli_snapshot_with_where_reemits_only_the_matching_rows(
    stack: StackSettings, pipeline: PipelineConfig, cli_env: dict[str, str]
):
    topic = pipeline.topic("products")
    start = _end_offsets(stack, topic)
    expected = {
        id_ for id_, (sku, _, price) in _current_products(stack, SKU).items() if Decimal(price) > 10
    }
    assert expected, "the seed must have rows above the filter's threshold"

    result = CliRunner().invoke(
        app, ["snapshot", "products", "--where", f"sku LIKE '{SKU}%' AND price > 10", "--timeout", "300"], env=cli_env
    )
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and f"{len(expected)} rows re-emitted" in result.output

    reader = TopicReader(stack, topic, start)
    try:
        def reread() -> set[int]:
            return {key["id"] for key, change in reader.read_to_end() if change is not None and change.op == "r"}

        wait_until(lambda: reread() >= expected, timeout=60, reason="op=r records for every matching row")
        assert reread() == expected
    finally:
        reader.close()


def test_unknown_table_is_refused_before_anything_is_signalled(
    stack: StackSettings, pipeline: PipelineConfig, cli_env: dict[str, str]
):
    table = f"nope_{RUN}"
    with pytest.raises(StackError, match=r"unknown table .*public\.products"):
        snapshot.run(stack, pipeline, table)

    result = CliRunner().invoke(app, ["snapshot", table], env=cli_env)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown table" in lines[0] and "public.customers" in lines[0], result.output
    assert _signal_rows_mentioning(stack, table) == 0


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("price > 1; DELETE FROM products", "single SQL expression"),
        ("price > 1 -- the rest", "comment"),
        ("price > 1 /* the rest */", "comment"),
        ("price > 1) OR (true", "did not open"),
        ("(price > 1", "unclosed"),
        ("name = 'it''s", "unterminated"),
        ("name = E'\\'' OR true", "single SQL expression"),
        ("name = $$x$$", "single SQL expression"),
        ("   ", "empty"),
    ],
)
def test_a_where_that_is_not_one_expression_is_refused(where: str, problem: str):
    with pytest.raises(snapshot.SnapshotError, match=problem):
        snapshot.check_where(where)


@pytest.mark.parametrize(
    "where", ["price > 10", "sku LIKE 'a--b/*' AND (price > 1 OR name = ')')", "\"name\" = 'x''y'"]
)
def test_a_single_expression_is_accepted(where: str):
    assert snapshot.check_where(where) == where


def test_a_where_postgres_rejects_is_refused_before_anything_is_signalled(
    stack: StackSettings, pipeline: PipelineConfig
):
    marker = f"no_such_column_{RUN}"
    with pytest.raises(snapshot.SnapshotError, match=marker):
        snapshot.run(stack, pipeline, "products", where=f"{marker} > 1")
    assert _signal_rows_mentioning(stack, marker) == 0


def test_topics_lists_the_products_topic_with_at_least_one_message_per_row(
    stack: StackSettings, pipeline: PipelineConfig, cli_env: dict[str, str]
):
    rows = len(_current_products(stack))
    summaries = {summary.name: summary for summary in topics.summarize(stack, pipeline)}
    products = summaries[pipeline.topic("products")]
    assert products.partitions == pipeline.source.partitions
    assert products.messages >= rows
    assert sum(products.end_offsets.values()) >= rows
    assert summaries[topics.notifications_topic(pipeline)].messages > 0

    result = CliRunner().invoke(app, ["topics"], env=cli_env)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if pipeline.topic("products") in line)
    cells = [cell.strip() for cell in line.split("│") if cell.strip()]
    assert int(cells[1]) == pipeline.source.partitions and int(cells[2]) >= rows and cells[3].startswith("0:")


def test_tail_from_the_beginning_prints_three_events(
    stack: StackSettings, pipeline: PipelineConfig, cli_env: dict[str, str]
):
    result = CliRunner().invoke(app, ["tail", "products", "--from-beginning", "--max", "3"], env=cli_env)
    assert result.exit_code == 0, result.output
    events = [line for line in result.output.splitlines() if line.strip()]
    assert len(events) == 3, result.output
    for event in events:
        assert " op=" in event or " tombstone " in event, event
        assert "lsn=" in event or "tombstone" in event


def test_tail_of_an_unknown_table_names_the_configured_ones(cli_env: dict[str, str]):
    result = CliRunner().invoke(app, ["tail", "nope", "--max", "1"], env=cli_env)
    assert result.exit_code == 1
    assert "unknown table 'nope'" in result.output and "public.products" in result.output
