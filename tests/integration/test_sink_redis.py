"""The Redis cache sink against a real Redis, through Spark: what Redis adds to the contract every sink
keeps (tests/integration/test_sink_contract.py): its keys and encoding, batching, atomicity,
concurrent writers, aggregates, clearing."""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis

from services.settings import StackSettings
from spark_jobs.model import config
from spark_jobs.model.catalogue import Column
from spark_jobs.model.config import CacheView, PipelineConfig, SearchView, TableConfig
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis import ENCODING, CacheMismatchError, RedisSink, decode_row, read_types
from spark_jobs.sinks.redis._commands import commands
from spark_jobs.sinks.redis._scripts import Script
from spark_jobs.sinks.redis._ship import Shipper
from tests.demo_catalogue import demo_catalogue
from tests.sink_batches import apply
from tests.unit.spark_frames import change, frame

pytestmark = pytest.mark.stack

PIPELINE = config.load()


@pytest.fixture
def client(stack: StackSettings):
    client = redis.Redis(host=stack.host, port=stack.redis_port)
    yield client
    client.close()


@pytest.fixture
def prefix(client: redis.Redis):
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def url(stack: StackSettings) -> str:
    return f"redis://{stack.host}:{stack.redis_port}/0"


@pytest.fixture
def sink(url: str, prefix: str, spark) -> RedisSink:
    sink = RedisSink(url, PIPELINE, key_prefix=prefix)
    sink.setup(spark, demo_catalogue())
    return sink


def stored(client: redis.Redis, key: str, table: str = "products", prefix: str = "") -> dict[str, Any]:
    return decode_row(client.hgetall(key), read_types(client, table, prefix) if prefix else None)


def test_an_upsert_is_stored_as_text_and_reads_back_typed(sink, client, prefix, spark):
    after = {"id": "1", "sku": "FX-1", "price": "12.50", "tags": '["kitchen","blue"]',
             "attributes": '{"color": "blue"}', "updated_at": "2024-01-01T10:00:00.123456Z", "description": None}
    assert apply(sink, spark, [change((5, 7), key=1, after=after)]) == {}
    raw = client.hgetall(f"{prefix}products:1")
    assert raw[b"price"] == b"12.50" and raw[b"sku"] == b"FX-1", "text as text, NUMERIC exact, no JSON quotes"
    assert b"description" not in raw, "NULL is an absent field"
    assert (raw[VERSION_MAJOR.encode()], raw[VERSION_MINOR.encode()]) == (b"5", b"7")
    assert raw[COMMIT_TS.encode()] == b"2024-01-01T00:00:00.000Z"
    row = stored(client, f"{prefix}products:1", prefix=prefix)
    assert row["id"] == 1 and row["tags"] == ["kitchen", "blue"] and row["attributes"] == {"color": "blue"}
    assert row["description"] is None and row["price"] == "12.50"


def test_a_tombstone_is_a_hash_of_the_delete_version_never_lowered_and_gone_once_the_row_is_re_created(
        sink, client, prefix, spark):
    """The keys behind the contract's deletes (tests/integration/test_sink_contract.py)."""
    apply(sink, spark, [change((5, 0), op="c")])
    apply(sink, spark, [change((7, 0), op="d")])
    assert client.hgetall(f"{prefix}tideline:tombstone:products:1") == {b"major": b"7", b"minor": b"0"}
    apply(sink, spark, [change((6, 9), op="d")])
    assert client.hget(f"{prefix}tideline:tombstone:products:1", "major") == b"7"
    apply(sink, spark, [change((8, 0), op="c")])  # re-created: wins and makes the tombstone redundant
    assert not client.exists(f"{prefix}tideline:tombstone:products:1")


def test_unchanged_toast_without_a_stored_row_is_rejected_not_written_partially(sink, client, prefix, spark):
    orphan = change((5, 0), key=7, after={"id": "7", "name": "no description"}, unavailable=("description",))
    rejected = apply(sink, spark, [orphan, change((5, 1), key=8)])
    assert list(rejected) == [0] and "description" in rejected[0]
    assert not client.exists(f"{prefix}products:7")
    assert client.exists(f"{prefix}products:8"), "the rest of the batch is applied"


def test_a_bad_row_is_rejected_and_the_rest_applied(sink, client, prefix, spark):
    client.set(f"{prefix}products:1", "not a hash")
    rejected = apply(sink, spark, [change((5, 0), key=1), change((2**53, 0), key=2), change((5, 0), key=3)])
    assert set(rejected) == {0, 1}
    assert "WRONGTYPE" in rejected[0] and "2^53" in rejected[1]
    assert client.exists(f"{prefix}products:3")


def test_a_truncate_is_a_watermark_hash_that_subsumes_tombstones_and_spares_tables_named_alike(
        sink, client, prefix, spark):
    """The keys behind the contract's truncates: SCAN patterns must not reach `order_items:*`."""
    apply(sink, spark, [change((10, i), table="orders", key=i, after={"id": str(i)}) for i in range(40)])
    apply(sink, spark, [change((20, 0), table="orders", key=40, op="d")])  # a tombstone the truncate subsumes
    items = {"order_id": "1", "line_no": "1"}  # another table whose name starts with "order"
    apply(sink, spark, [change((10, 0), table="order_items", key=items, after=items)])
    assert apply(sink, spark, [change((50, 0), table="orders", op="t")]) == {}
    assert not any(client.scan_iter(match=f"{prefix}orders:*"))
    assert client.hgetall(f"{prefix}tideline:truncated:orders") == {b"major": b"50", b"minor": b"0"}
    assert not client.exists(f"{prefix}tideline:tombstone:orders:40")
    assert client.exists(f"{prefix}order_items:[1,1]")


def test_a_new_column_appears_with_its_type_and_a_dropped_one_goes(sink, client, prefix, spark):
    catalogue = demo_catalogue()
    customers = catalogue["customers"]
    grown = {**catalogue, "customers": replace(
        customers, columns={**customers.columns, "loyalty_tier": Column("loyalty_tier", "INT4")})}
    apply(sink, spark, [change((5, 0), table="customers", after={"id": "1", "name": "Ada", "fax": "123"})])
    apply(sink, spark, [change((6, 0), table="customers", after={"id": "1", "name": "Ada", "loyalty_tier": "3"})],
          grown)
    row = stored(client, f"{prefix}customers:1", "customers", prefix)
    assert row["loyalty_tier"] == 3 and "fax" not in row


def test_tables_without_a_cache_view_are_ignored(url, client, prefix, spark):
    pipeline = PipelineConfig(tables={"customers": TableConfig(cache=CacheView()),
                                      "audit": TableConfig(search=SearchView())})
    sink = RedisSink(url, pipeline, key_prefix=prefix)
    sink.setup(spark, demo_catalogue())
    assert apply(sink, spark, [change((5, 0), table="audit"), change((5, 0), table="audit", op="t")]) == {}
    assert [k for k in client.scan_iter(match=f"{prefix}*") if b"tideline:" not in k] == []


def test_2000_changes_take_a_handful_of_script_calls(sink, client, prefix, spark):
    rows = [change((5, i), table="customers", key=i, after={"id": str(i), "name": f"c{i}"}) for i in range(2000)]
    calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert apply(sink, spark, rows) == {}
    made = client.info("commandstats")["cmdstat_evalsha"]["calls"] - calls
    assert made <= 6, f"chunks of 500 rows per EVALSHA in each of 2 partitions, not one per row: {made}"
    assert client.hget(f"{prefix}customers:1999", "name") == b"c1999"


def test_concurrent_writers_of_the_same_keys_end_at_the_max_version(sink, client, prefix, spark):
    # Two writers race on the same 300 keys, released together each round by a barrier: one deletes at
    # the odd versions, the other upserts at the even ones. A guard that reads and then writes in two steps
    # lets a stale delete land after the newer upsert; the script's read-and-write cannot. Every round is
    # checked (by the barrier's action, while both writers wait).
    keys, rounds = range(300), 4
    finished, wrong, errors = [0], [], []

    def check_round() -> None:
        if finished[0]:
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.hget(f"{prefix}products:{k}", VERSION_MAJOR)
            behind = [k for k, v in zip(keys, pipe.execute(), strict=True) if v != str(2 * finished[0]).encode()]
            if behind:
                wrong.append((2 * finished[0], len(behind)))
        finished[0] += 1

    barrier = threading.Barrier(2, action=check_round)

    def writer(op: str, offset: int) -> None:
        try:
            for r in range(1, rounds + 1):
                v = 2 * r - offset
                batch = [change((v, 0), op=op, key=k, after=None if op == "d" else {"id": str(k), "v": str(v)})
                         for k in keys]
                barrier.wait()
                assert apply(sink, spark, batch) == {}
            barrier.wait()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=args) for args in (("d", 1), ("u", 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert finished[0] == rounds + 1 and wrong == [], "(version, keys not at it) after a round"


def test_scripts_the_server_lost_are_loaded_again(sink, client, prefix, spark):
    # A script the server has never seen stands in for a flushed cache (SCRIPT FLUSH would hit other users).
    fresh = Script(f"-- {uuid.uuid4()}\n{sink._apply.source}")
    assert client.script_exists(fresh.sha) == [False]
    batch = commands(frame(spark, [change((5, 0))]), prefix).toArrow().to_batches()[0]
    shipper = Shipper(sink.url, prefix, fresh, sink._prune)
    with redis.Redis.from_url(sink.url) as conn:
        assert shipper.ship(conn, batch).num_rows == 0
    assert client.script_exists(fresh.sha) == [True]
    assert client.hget(f"{prefix}products:1", "name") == b"v(5, 0)"


def test_setup_is_idempotent_and_records_the_encoding(sink, client, prefix, spark):
    sink.setup(spark, demo_catalogue())
    sink.setup(spark, demo_catalogue())
    assert all(client.script_exists(sink._apply.sha, sink._prune.sha))
    assert client.hget(f"{prefix}tideline:aggregates", "encoding") == ENCODING.encode()


def test_connection_errors_fail_the_batch_so_it_is_retried(sink, spark):
    sink.url = "redis://127.0.0.1:1/0"  # nothing listens there
    assert not sink.available()
    with pytest.raises(Exception, match=r"(?i)connect"):
        apply(sink, spark, [change((5, 0))])


# ---- aggregates (pipeline.yaml's cache_aggregates: customer_stats, top_products) -----------------------


def order(version, key, customer=1, status="pending", total="10.00", op="u"):
    after = {"id": str(key), "customer_id": str(customer), "status": status, "total": total}
    return change(version, op, "orders", key, None if op == "d" else after)


def item(version, order_id, line_no, product=1, quantity=1, op="u"):
    key = {"order_id": str(order_id), "line_no": str(line_no)}
    after = {**key, "product_id": str(product), "quantity": str(quantity), "unit_price": "1.00"}
    return change(version, op, "order_items", key, None if op == "d" else after)


def figures(client: redis.Redis, prefix: str) -> tuple[dict, dict]:
    """(customer -> (order_count, paid_total text), product -> units sold) as Redis holds them."""
    stats = {}
    for key in client.scan_iter(match=f"{prefix}customer:*:stats"):
        count, paid = client.hmget(key, "order_count", "paid_total")
        stats[int(key.decode()[len(prefix):].split(":")[1])] = (int(count), paid.decode())
    ranked = client.zrange(f"{prefix}top_products:units_sold", 0, -1, withscores=True)
    return stats, {int(member): score for member, score in ranked}


def group_by(changes: list[dict]) -> tuple[dict, dict]:
    """The definition in docs/sinks/redis.md, over the newest change per row (what PostgreSQL holds)."""
    from decimal import Decimal

    newest: dict = {}
    for c in sorted(changes, key=lambda c: (c["version"]["major"], c["version"]["minor"])):
        newest[(c["table"], c["row_id"])] = c["after"]
    orders = {key: row for (table, key), row in newest.items() if table == "orders" and row}
    items = [row for (table, _), row in newest.items() if table == "order_items" and row]
    stats: dict = {}
    for row in orders.values():
        count, paid = stats.get(int(row["customer_id"]), (0, Decimal("0.00")))
        extra = Decimal(row["total"]) if row["status"] in ("paid", "shipped") else 0
        stats[int(row["customer_id"])] = (count + 1, paid + extra)
    units: dict = {}
    for row in items:
        parent = orders.get(row["order_id"])
        if parent and parent["status"] != "cancelled":
            units[int(row["product_id"])] = units.get(int(row["product_id"]), 0) + int(row["quantity"])
    return {c: (n, f"{paid:.2f}") for c, (n, paid) in stats.items()}, {p: n for p, n in units.items() if n}


def history(rnd: random.Random, steps: int) -> list[dict]:
    """Random commits to 4 orders and their items: status moves, customer and product changes,
    quantity edits, deletes and re-inserts, in version order."""
    changes = []
    for step in range(1, steps + 1):
        version = (step, 0)
        if rnd.random() < 0.4:
            changes.append(order(version, rnd.randint(1, 4), customer=rnd.randint(1, 3), op=rnd.choice("cuud"),
                                 status=rnd.choice(["pending", "paid", "shipped", "cancelled"]),
                                 total=f"{rnd.randint(0, 9999) / 100:.2f}"))
        else:
            changes.append(item(version, rnd.randint(1, 4), rnd.randint(1, 3), product=rnd.randint(1, 3),
                                quantity=rnd.randint(1, 9), op=rnd.choice("cuud")))
    return changes


@pytest.mark.parametrize("seed", range(3))
def test_aggregates_equal_group_by_whatever_the_order_and_however_often_changes_arrive(
    sink, client, prefix, spark, seed
):
    rnd = random.Random(seed)
    changes = history(rnd, 120)
    # Out of order across and within tables, every change delivered twice, in uneven batches:
    # what Kafka partitions, retried batches and a replay from offset zero can do.
    delivered = changes + rnd.sample(changes, len(changes))
    rnd.shuffle(delivered)
    while delivered:
        size = rnd.randint(20, 60)
        batch, delivered = delivered[:size], delivered[size:]
        assert apply(sink, spark, batch) == {}
    assert figures(client, prefix) == group_by(changes)


def test_an_order_status_change_moves_all_its_items_and_a_replay_moves_nothing(sink, client, prefix, spark):
    # Items arrive before their order: they count once the order is known, not before.
    apply(sink, spark, [item((1, 1), 7, 1, product=3, quantity=2), item((1, 2), 7, 2, product=4, quantity=5)])
    assert figures(client, prefix) == ({}, {})
    apply(sink, spark, [order((1, 3), 7, customer=9, status="pending", total="12.50")])
    assert figures(client, prefix) == ({9: (1, "0.00")}, {3: 2, 4: 5})
    paid = order((2, 0), 7, customer=9, status="paid", total="12.50")
    apply(sink, spark, [paid])
    apply(sink, spark, [paid])  # a replay
    assert figures(client, prefix) == ({9: (1, "12.50")}, {3: 2, 4: 5})
    apply(sink, spark, [order((3, 0), 7, customer=9, status="cancelled", total="12.50")])
    assert figures(client, prefix) == ({9: (1, "0.00")}, {})
    apply(sink, spark, [order((2, 5), 7, customer=9, status="paid", total="12.50")])  # late and older: ignored
    apply(sink, spark, [order((4, 0), 7, op="d")])
    assert figures(client, prefix) == ({}, {})


def test_clear_deletes_every_key_the_sink_wrote_and_no_other_key(sink, client, prefix, spark):
    """`tide rebuild cache` clears through the sink: its rows, tombstones, bookkeeping and aggregates
    go; a key of someone else's in the same database stays, even under the same prefix."""
    apply(sink, spark, [order((1, 3), 7, customer=9, status="paid", total="12.50"),
                        item((1, 4), 7, 1, product=3, quantity=2), order((1, 5), 8, op="d")])
    assert figures(client, prefix) == ({9: (1, "12.50")}, {3: 2}) and client.exists(f"{prefix}orders:7")
    theirs = [f"{prefix}sessions:42", f"other-{uuid.uuid4().hex[:8]}:orders:7"]
    for key in theirs:
        client.set(key, "kept")
    try:
        sink.clear()
        left = sorted(key.decode() for key in client.scan_iter(match=f"{prefix}*", count=1000))
        assert left == [theirs[0]] and client.get(theirs[1]) == b"kept"
        sink.setup(spark, demo_catalogue())  # a cleared cache takes the declaration again and fills up
        apply(sink, spark, [order((1, 3), 7, customer=9, status="paid", total="12.50")])
        assert figures(client, prefix) == ({9: (1, "12.50")}, {})
    finally:
        client.delete(*theirs)


def test_truncates_take_their_rows_out_of_the_aggregates(sink, client, prefix, spark):
    apply(sink, spark, [order((1, i), i, customer=i % 2, status="paid", total="1.10") for i in range(1, 9)])
    apply(sink, spark, [item((2, i), i, 1, product=i % 3, quantity=i) for i in range(1, 9)])
    assert apply(sink, spark, [change((3, 0), table="order_items", op="t")]) == {}
    assert figures(client, prefix) == ({0: (4, "4.40"), 1: (4, "4.40")}, {})
    apply(sink, spark, [item((4, 0), 1, 1, product=5, quantity=3)])  # after the truncate
    assert figures(client, prefix)[1] == {5: 3}
    assert apply(sink, spark, [change((5, 0), table="orders", op="t")]) == {}
    assert figures(client, prefix) == ({}, {}), "an item whose order is gone counts nothing (inner join)"


def test_a_value_the_aggregates_cannot_read_rejects_the_change_and_writes_nothing(sink, client, prefix, spark):
    apply(sink, spark, [order((1, 0), 1, status="paid", total="5.00")])
    before = {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*")}
    rejected = apply(sink, spark, [order((2, 0), 1, status="paid", total="5.001")])
    assert list(rejected) == [0] and "5.001 has more than 2 decimal places" in rejected[0]
    assert {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*")} == before


def test_setup_refuses_a_cache_built_before_or_with_other_aggregates_or_values(url, client, prefix, spark):
    plain = PipelineConfig(tables=PIPELINE.tables)  # the same tables, no aggregates
    client.hset(f"{prefix}orders:1", "id", '"1"')  # a row written by an earlier version, no declaration
    with pytest.raises(CacheMismatchError, match="earlier Tideline"):
        RedisSink(url, PIPELINE, key_prefix=prefix).setup(spark, demo_catalogue())
    client.delete(f"{prefix}orders:1")
    RedisSink(url, plain, key_prefix=prefix).setup(spark, demo_catalogue())  # an empty cache takes a declaration
    with pytest.raises(CacheMismatchError, match="another cache_aggregates declaration"):
        RedisSink(url, PIPELINE, key_prefix=prefix).setup(spark, demo_catalogue())
    client.hset(f"{prefix}tideline:aggregates", "encoding", "json")
    with pytest.raises(CacheMismatchError, match="earlier encoding"):
        RedisSink(url, plain, key_prefix=prefix).setup(spark, demo_catalogue())
