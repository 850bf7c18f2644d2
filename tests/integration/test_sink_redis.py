"""The Redis cache sink against a real Redis: version guard, deletes, TOAST, truncates, batching, atomicity."""

from __future__ import annotations

import json
import random
import threading
import uuid
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from redis.connection import AbstractConnection

from services.settings import StackSettings
from spark_jobs import config
from spark_jobs.aggregates import AggregateConfigError
from spark_jobs.changes import Change, decode
from spark_jobs.config import CacheView, PipelineConfig, SearchView, TableConfig
from spark_jobs.merge import newest_per_row
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis import RedisSink, _Script, decode_row
from tests import stale_fill

pytestmark = pytest.mark.stack

FIXTURES = Path(__file__).parent.parent / "unit" / "fixtures" / "debezium_records.json"
RECORDS = {r["name"]: r for r in json.loads(FIXTURES.read_text())}
PIPELINE = config.load()


def record(name: str) -> Change:
    r = RECORDS[name]
    return decode(r["topic"], r["key"].encode() if r["key"] else None, r["value"].encode() if r["value"] else None)


def change(seq, op="u", table="products", key=1, after=None, unavailable=()):
    """A change built directly; `key` is an id or a whole key dict."""
    key = key if isinstance(key, dict) else {"id": key}
    if after is None and op not in ("d", "t"):
        after = {**key, "name": f"v{seq}", "description": f"text {seq}"}
    return Change(
        table=table, op=op, key={} if op == "t" else key, before=None, after=after, sequence=seq,
        lsn=seq[1], tx_id=None, commit_ts_ms=1_700_000_000_000, snapshot=None, unavailable=frozenset(unavailable),
    )


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
def sink(url: str, prefix: str) -> RedisSink:
    sink = RedisSink(url, PIPELINE, key_prefix=prefix)
    sink.setup(PIPELINE)
    return sink


def stored(client: redis.Redis, key: str) -> dict:
    return decode_row(client.hgetall(key))


def test_upsert_reads_back_as_json_with_exact_decimals(sink, client, prefix):
    insert = record("products_insert")
    assert sink.write([insert]) == []

    raw = client.hgetall(f"{prefix}products:1")
    assert raw[b"price"] == b'"12.50"', "NUMERIC is a JSON string, exact"
    assert raw[VERSION_MAJOR.encode()] == str(insert.sequence[0]).encode()
    assert raw[VERSION_MINOR.encode()] == str(insert.sequence[1]).encode()
    committed = datetime.fromisoformat(json.loads(raw[COMMIT_TS.encode()]))
    assert committed.timestamp() * 1000 == pytest.approx(insert.commit_ts_ms)
    row = decode_row(raw)
    assert row["id"] == 1 and row["sku"] == "FX-1"
    assert row["tags"] == ["kitchen", "blue"]
    assert row["attributes"] == {"color": "blue", "dims": {"h": 10}}
    assert datetime.fromisoformat(row["updated_at"]) == insert.after["updated_at"]
    assert row["updated_at"].endswith("+00:00")
    assert row["description"] == insert.after["description"]


def test_older_change_after_newer_is_ignored(sink, client, prefix):
    assert sink.write([change((5, 2))]) == []
    assert sink.write([change((5, 1)), change((4, 9))]) == []
    assert stored(client, f"{prefix}products:1")["name"] == "v(5, 2)"


def test_equal_version_replay_changes_nothing(sink, client, prefix):
    batch = [change((5, 5), key=1), change((5, 6), key=2), change((6, 0), op="d", key=3)]
    sink.write(batch)
    before = {key: client.hgetall(key) for key in client.scan_iter(match=f"{prefix}*")}
    sink.write(batch)
    # Same version, different content: still a replay, never applied.
    sink.write([change((5, 5), key=1, after={"id": 1, "name": "impostor"})])
    after = {key: client.hgetall(key) for key in client.scan_iter(match=f"{prefix}*")}
    assert after == before


def test_delete_then_late_older_upsert_does_not_resurrect(sink, client, prefix):
    sink.write([change((5, 0), op="c")])
    sink.write([change((7, 0), op="d")])
    assert not client.exists(f"{prefix}products:1")
    assert client.hgetall(f"{prefix}tideline:tombstone:products:1") == {b"major": b"7", b"minor": b"0"}

    sink.write([change((6, 0))])
    assert not client.exists(f"{prefix}products:1"), "a late older upsert must not resurrect a deleted row"
    sink.write([change((6, 9), op="d")])
    assert client.hgetall(f"{prefix}tideline:tombstone:products:1")[b"major"] == b"7", "tombstone never lowered"

    # A newer insert (the row was re-created) wins and makes the tombstone redundant.
    sink.write([change((8, 0), op="c")])
    assert stored(client, f"{prefix}products:1")["name"] == "v(8, 0)"
    assert not client.exists(f"{prefix}tideline:tombstone:products:1")


def test_delete_arriving_before_the_insert_it_follows(sink, client, prefix):
    sink.write([change((9, 0), op="d", key=4)])
    sink.write([change((3, 0), op="c", key=4)])
    assert not client.exists(f"{prefix}products:4")


def test_unchanged_toast_update_keeps_the_stored_description(sink, client, prefix):
    update = record("products_update_unchanged_toast")
    assert update.unavailable == {"description"}
    insert = replace(
        record("products_insert"), key={"id": 2}, sequence=(update.sequence[0] - 10, 0),
        after={**record("products_insert").after, "id": 2, "description": "kept " * 5000},
    )
    sink.write([insert])
    assert sink.write([update]) == []
    row = stored(client, f"{prefix}products:2")
    assert row["description"] == "kept " * 5000
    assert row["price"] == "6.00" and row["name"] == "Toast mug"
    assert row["tags"] is None and row["attributes"] is None
    assert int(client.hget(f"{prefix}products:2", VERSION_MINOR)) == update.sequence[1]


def test_unchanged_toast_without_a_stored_row_is_rejected_not_written_partially(sink, client, prefix):
    orphan = change((5, 0), key=7, after={"id": 7, "name": "no description"}, unavailable={"description"})
    rejected = sink.write([orphan, change((5, 1), key=8)])
    assert [(r.change, "description" in r.reason) for r in rejected] == [(orphan, True)]
    assert not client.exists(f"{prefix}products:7")
    assert client.exists(f"{prefix}products:8"), "the rest of the partition is applied"


def toast_change(seq, key, description):
    """An upsert of products for tests/stale_fill.py: no description means Debezium's placeholder."""
    after = {"id": key, "name": f"v{seq}"} | ({} if description is None else {"description": description})
    return change(seq, key=key, after=after, unavailable=() if description is not None else {"description"})


def test_a_stale_full_image_in_the_batch_does_not_overwrite_a_newer_stored_toast_value(sink, client, prefix):
    assert sink.write(stale_fill.stored_first(toast_change)) == []
    assert sink.write(stale_fill.batch(toast_change)) == []
    for key, description in stale_fill.EXPECTED.items():
        row = stored(client, f"{prefix}products:{key}")
        assert (row["description"], row["name"]) == (description, f"v{stale_fill.UPDATE}"), key
        assert (row[VERSION_MAJOR], row[VERSION_MINOR]) == stale_fill.UPDATE


def test_a_bad_row_is_rejected_and_the_rest_applied(sink, client, prefix):
    client.set(f"{prefix}products:1", "not a hash")
    huge = change((2**53, 0), key=2)
    rejected = sink.write([change((5, 0), key=1), huge, change((5, 0), key=3)])
    reasons = {r.change.key["id"]: r.reason for r in rejected}
    assert set(reasons) == {1, 2}
    assert "WRONGTYPE" in reasons[1] and "2^53" in reasons[2]
    assert client.exists(f"{prefix}products:3")


def test_truncate_removes_older_rows_and_keeps_newer_ones(url, client, prefix):
    # A small SCAN page so the truncate walks the keyspace in several batches.
    sink = RedisSink(url, PIPELINE, key_prefix=prefix, scan_count=10)
    sink.setup(PIPELINE)
    sink.write([change((10, i), table="orders", key=i, after={"id": i}) for i in range(40)])
    sink.write([change((20, 0), table="orders", key=40, op="d")])  # a tombstone the truncate subsumes
    sink.write([change((60, 0), table="orders", key=41, after={"id": 41})])  # committed after the truncate
    items = {"order_id": 1, "line_no": 1}  # another table whose name starts with "order"
    sink.write([change((10, 0), table="order_items", key=items, after=items)])

    assert sink.write([change((50, 0), table="orders", op="t")]) == []

    sink.write([change((70, 0), table="orders", key=42, after={"id": 42})])  # applied after the truncate
    sink.write([change((40, 0), table="orders", key=3, after={"id": 3})])  # late, older than the truncate
    orders = sorted(key.decode() for key in client.scan_iter(match=f"{prefix}orders:*"))
    assert orders == [f"{prefix}orders:41", f"{prefix}orders:42"]
    assert client.hgetall(f"{prefix}tideline:truncated:orders") == {b"major": b"50", b"minor": b"0"}
    assert not client.exists(f"{prefix}tideline:tombstone:orders:40")
    assert client.exists(f"{prefix}order_items:[1,1]")

    # An older truncate (replayed or late) never lowers the watermark.
    sink.write([change((30, 0), table="orders", op="t")])
    assert client.hget(f"{prefix}tideline:truncated:orders", "major") == b"50"


def test_a_new_column_appears_and_a_dropped_one_goes(sink, client, prefix):
    sink.write([change((5, 0), table="customers", after={"id": 1, "name": "Ada", "fax": "123"})])
    sink.write([change((6, 0), table="customers", after={"id": 1, "name": "Ada", "loyalty_tier": "gold"})])
    row = stored(client, f"{prefix}customers:1")
    assert row["loyalty_tier"] == "gold" and "fax" not in row


def test_composite_key(sink, client, prefix):
    key = {"order_id": 7, "line_no": 2}
    sink.write([change((5, 0), table="order_items", key=key, after={**key, "quantity": 3})])
    assert stored(client, f"{prefix}order_items:[7,2]")["quantity"] == 3
    sink.write([change((6, 0), table="order_items", key=key, op="d")])
    assert not client.exists(f"{prefix}order_items:[7,2]")
    assert client.exists(f"{prefix}tideline:tombstone:order_items:[7,2]")


def test_tables_without_a_cache_view_are_ignored(url, client, prefix):
    pipeline = PipelineConfig(
        tables={"customers": TableConfig(cache=CacheView()), "audit": TableConfig(search=SearchView())}
    )
    sink = RedisSink(url, pipeline, key_prefix=prefix)
    assert sink.write([change((5, 0), table="audit"), change((5, 0), table="audit", op="t")]) == []
    assert list(client.scan_iter(match=f"{prefix}*")) == []


def test_a_partition_of_2000_changes_takes_a_handful_of_round_trips(sink, client, prefix, monkeypatch):
    changes = [change((5, i), table="customers", key=i, after={"id": i, "name": f"c{i}"}) for i in range(2000)]
    evalsha_before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    writes: list[bytes] = []
    send = AbstractConnection.send_packed_command

    def counting(self, command, *args, **kwargs):  # one socket write = one round trip
        writes.append(b"".join(command) if isinstance(command, list) else command)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    assert sink.write(changes) == []
    monkeypatch.undo()

    assert sum(b"EVALSHA" in w for w in writes) == 4, "2,000 changes in chunks of 500"
    assert len(writes) <= 10, f"4 pipelines plus the connection handshake, got {len(writes)}"
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] - evalsha_before >= 2000
    assert stored(client, f"{prefix}customers:1999")["name"] == "c1999"


def test_concurrent_writers_of_the_same_keys_end_at_the_max_version(url, client, prefix):
    # Two writers race on the same 500 keys, released together each round by a barrier: one deletes at
    # the odd versions, the other upserts at the even ones. A guard that reads and then writes in two steps
    # lets a stale delete land after the newer upsert; the script's read-and-write cannot. Every round is
    # checked (by the barrier's action, while both writers wait), so each round is a chance to catch it.
    keys, rounds = range(500), 10
    finished, wrong = [0], []

    def check_round() -> None:
        if finished[0]:
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.hget(f"{prefix}products:{k}", "v")
            behind = [k for k, v in zip(keys, pipe.execute()) if v != str(2 * finished[0]).encode()]
            if behind:
                wrong.append((2 * finished[0], len(behind)))
        finished[0] += 1

    barrier = threading.Barrier(2, action=check_round)
    errors: list[BaseException] = []

    def writer(op: str, offset: int) -> None:
        try:
            sink = RedisSink(url, PIPELINE, key_prefix=prefix)
            for r in range(1, rounds + 1):
                v = 2 * r - offset
                batch = [change((v, 0), op=op, key=k, after=None if op == "d" else {"id": k, "v": v}) for k in keys]
                barrier.wait()
                assert sink.write(batch) == []
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
    assert finished[0] == rounds + 1
    assert wrong == [], "(version, keys not at it) after a round"
    assert {stored(client, f"{prefix}products:{k}")[VERSION_MAJOR] for k in keys} == {2 * rounds}


def test_scripts_the_server_lost_are_reloaded(sink, client, prefix):
    # A script the server has never seen stands in for a flushed cache (SCRIPT FLUSH would hit other users).
    fresh = _Script(f"-- {uuid.uuid4()}\n{sink.apply_script.source}")
    assert client.script_exists(fresh.sha) == [False]
    calls = [sink._apply_call(change((5, 0)))]
    with redis.Redis.from_url(sink.url) as conn:
        assert sink._run(conn, fresh, calls) == [1]
    assert client.script_exists(fresh.sha) == [True]
    assert stored(client, f"{prefix}products:1")["name"] == "v(5, 0)"


def test_setup_is_idempotent(sink, client):
    sink.setup(PIPELINE)
    sink.setup(PIPELINE)
    assert all(client.script_exists(sink.apply_script.sha, sink.prune_script.sha))


def test_connection_errors_raise_so_the_batch_is_retried(prefix):
    sink = RedisSink("redis://127.0.0.1:1/0", PIPELINE, key_prefix=prefix)
    with pytest.raises(redis.ConnectionError):
        sink.write([change((5, 0))])


# ---- aggregates (pipeline.yaml's cache_aggregates: customer_stats, top_products) -----------------------


def order(seq, key, customer=1, status="pending", total="10.00", op="u"):
    after = {"id": key, "customer_id": customer, "status": status, "total": Decimal(total)}
    return change(seq, op, "orders", key, None if op == "d" else after)


def item(seq, order_id, line_no, product=1, quantity=1, op="u"):
    key = {"order_id": order_id, "line_no": line_no}
    after = {**key, "product_id": product, "quantity": quantity, "unit_price": Decimal("1.00")}
    return change(seq, op, "order_items", key, None if op == "d" else after)


def figures(client: redis.Redis, prefix: str) -> tuple[dict, dict]:
    """(customer -> (order_count, paid_total text), product -> units sold) as Redis holds them."""
    stats = {}
    for key in client.scan_iter(match=f"{prefix}customer:*:stats"):
        count, paid = client.hmget(key, "order_count", "paid_total")
        stats[int(key.decode()[len(prefix) :].split(":")[1])] = (int(count), paid.decode())
    ranked = client.zrange(f"{prefix}top_products:units_sold", 0, -1, withscores=True)
    return stats, {int(member): score for member, score in ranked}


def group_by(changes: list[Change]) -> tuple[dict, dict]:
    """The definition in docs/sinks/redis.md, over the newest change per row (what PostgreSQL holds)."""
    newest: dict = {}
    for c in sorted(changes, key=lambda c: c.sequence):
        newest[(c.table, json.dumps(c.key, sort_keys=True))] = c.after
    orders = {key: row for (table, key), row in newest.items() if table == "orders" and row}
    items = [row for (table, _), row in newest.items() if table == "order_items" and row]
    stats: dict = {}
    for row in orders.values():
        count, paid = stats.get(row["customer_id"], (0, Decimal("0.00")))
        stats[row["customer_id"]] = (count + 1, paid + (row["total"] if row["status"] in ("paid", "shipped") else 0))
    units: dict = {}
    for row in items:
        parent = orders.get(json.dumps({"id": row["order_id"]}))
        if parent and parent["status"] != "cancelled":
            units[row["product_id"]] = units.get(row["product_id"], 0) + row["quantity"]
    return {c: (n, f"{paid:.2f}") for c, (n, paid) in stats.items()}, {p: n for p, n in units.items() if n}


def history(rnd: random.Random, steps: int) -> list[Change]:
    """Random commits to 4 orders and their items: status moves, customer and product changes,
    quantity edits, an item moved to another order, deletes and re-inserts, in version order."""
    changes = []
    for step in range(1, steps + 1):
        seq = (step, 0)
        if rnd.random() < 0.4:
            changes.append(order(seq, rnd.randint(1, 4), customer=rnd.randint(1, 3), op=rnd.choice("cuud"),
                                 status=rnd.choice(["pending", "paid", "shipped", "cancelled"]),
                                 total=f"{rnd.randint(0, 9999) / 100:.2f}"))
        else:
            changes.append(item(seq, rnd.randint(1, 4), rnd.randint(1, 3), product=rnd.randint(1, 3),
                                quantity=rnd.randint(1, 9), op=rnd.choice("cuud")))
    return changes


@pytest.mark.parametrize("seed", range(5))
def test_aggregates_equal_group_by_whatever_the_order_and_however_often_changes_arrive(sink, client, prefix, seed):
    rnd = random.Random(seed)
    changes = history(rnd, 120)
    # Out of order across and within tables, every change delivered twice, in uneven batches:
    # what Kafka partitions, retried batches and a replay from offset zero can do.
    delivered = changes + rnd.sample(changes, len(changes))
    rnd.shuffle(delivered)
    while delivered:
        size = rnd.randint(1, 30)
        batch, delivered = delivered[:size], delivered[size:]
        assert sink.write(newest_per_row(batch)) == []
    assert figures(client, prefix) == group_by(changes)


def test_an_order_status_change_moves_all_its_items_and_a_replay_moves_nothing(sink, client, prefix):
    # Items arrive before their order: they count once the order is known, not before.
    sink.write([item((1, 1), 7, 1, product=3, quantity=2), item((1, 2), 7, 2, product=4, quantity=5)])
    assert figures(client, prefix) == ({}, {})
    sink.write([order((1, 3), 7, customer=9, status="pending", total="12.50")])
    assert figures(client, prefix) == ({9: (1, "0.00")}, {3: 2, 4: 5})
    paid = order((2, 0), 7, customer=9, status="paid", total="12.50")
    sink.write([paid])
    sink.write([paid])  # a replay
    assert figures(client, prefix) == ({9: (1, "12.50")}, {3: 2, 4: 5})
    sink.write([order((3, 0), 7, customer=9, status="cancelled", total="12.50")])
    assert figures(client, prefix) == ({9: (1, "0.00")}, {})
    sink.write([order((2, 5), 7, customer=9, status="paid", total="12.50")])  # late and older: ignored
    sink.write([order((4, 0), 7, op="d")])
    assert figures(client, prefix) == ({}, {})


def test_truncates_take_their_rows_out_of_the_aggregates(url, client, prefix):
    sink = RedisSink(url, PIPELINE, key_prefix=prefix, scan_count=5)
    sink.setup(PIPELINE)
    sink.write([order((1, i), i, customer=i % 2, status="paid", total="1.10") for i in range(1, 9)])
    sink.write([item((2, i), i, 1, product=i % 3, quantity=i) for i in range(1, 9)])
    assert sink.write([change((3, 0), table="order_items", op="t")]) == []
    assert figures(client, prefix) == ({0: (4, "4.40"), 1: (4, "4.40")}, {})
    sink.write([item((4, 0), 1, 1, product=5, quantity=3)])  # after the truncate
    assert figures(client, prefix)[1] == {5: 3}
    assert sink.write([change((5, 0), table="orders", op="t")]) == []
    assert figures(client, prefix) == ({}, {}), "an item whose order is gone counts nothing (inner join)"


def test_a_value_the_aggregates_cannot_read_rejects_the_change_and_writes_nothing(sink, client, prefix):
    sink.write([order((1, 0), 1, status="paid", total="5.00")])
    before = {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*")}
    rejected = sink.write([order((2, 0), 1, status="paid", total="5.001")])
    assert len(rejected) == 1 and '"5.001" has more than 2 decimal places' in rejected[0].reason
    assert {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*")} == before


def test_setup_refuses_a_cache_built_before_or_with_other_aggregates(url, client, prefix):
    plain = PipelineConfig(tables=PIPELINE.tables)  # the same tables, no aggregates
    RedisSink(url, plain, key_prefix=prefix).write([order((1, 0), 1)])
    with pytest.raises(AggregateConfigError, match="built before its cache_aggregates were declared"):
        RedisSink(url, PIPELINE, key_prefix=prefix).setup(PIPELINE)
    client.delete(f"{prefix}orders:1")
    RedisSink(url, plain, key_prefix=prefix).setup(plain)  # an empty cache takes a declaration
    with pytest.raises(AggregateConfigError, match="another cache_aggregates declaration"):
        RedisSink(url, PIPELINE, key_prefix=prefix).setup(PIPELINE)
