"""The cache's aggregates end to end: under a concurrent writer, a kill -9 of the driver and a
replay of the whole changelog, Redis holds exactly what SQL GROUP BY computes.

The oracle here is hand-written SQL of the definitions in pipeline.yaml (docs/sinks/redis.md),
independent of the query `tide verify` generates from the declaration (which runs too).
"""

from __future__ import annotations

import os
import shutil
import signal
from decimal import Decimal

import psycopg
import pytest
import redis

from services.jobs import driver
from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.verify import verify
from tests.e2e.support import REDIS_DB, Workload, converged
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

CUSTOMER_STATS = """
SELECT customer_id, count(*), coalesce(sum(total) FILTER (WHERE status IN ('paid', 'shipped')), 0)
FROM orders WHERE customer_id IS NOT NULL GROUP BY customer_id
"""
UNITS_SOLD = """
SELECT i.product_id, sum(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id
WHERE o.status <> 'cancelled' AND i.product_id IS NOT NULL
GROUP BY i.product_id HAVING coalesce(sum(i.quantity), 0) <> 0
"""


def sql_figures(stack: StackSettings) -> tuple[dict[str, tuple[int, Decimal]], dict[str, int]]:
    with psycopg.connect(postgres.conninfo(stack)) as conn:
        stats = {str(c): (n, Decimal(paid)) for c, n, paid in conn.execute(CUSTOMER_STATS)}
        units = {str(p): int(n) for p, n in conn.execute(UNITS_SOLD)}
    return stats, units


def redis_figures(stack: StackSettings) -> tuple[dict[str, tuple[int, Decimal]], dict[str, int]]:
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    stats = {}
    for key in cache.scan_iter(match="customer:*:stats", count=1000):
        count, paid = cache.hmget(key, "order_count", "paid_total")
        stats[key.decode().split(":")[1]] = (int(count), Decimal(paid.decode()))
    units = {member.decode(): int(score) for member, score in cache.zrange("top_products:units_sold", 0, -1, withscores=True)}
    return stats, units


def assert_equal_to_sql(jobs: StackSettings, pipeline, stack: StackSettings) -> None:
    converged(jobs, pipeline, sinks=["cache"])  # tide verify: rows and aggregates, cache caught up
    expected, held = sql_figures(stack), redis_figures(stack)
    assert held[0] == expected[0], "customer:<id>:stats differs from SQL"
    assert held[1] == expected[1], "top_products:units_sold differs from SQL"
    assert expected[0] and expected[1], "the workload left nothing to aggregate"


def test_aggregates_equal_group_by_after_concurrent_writes_a_kill_9_and_a_full_replay(run, stack):
    jobs, pipeline, first = run
    first.finish(stop=False)  # the session's first minute of writes (test_apply counts them) ends first
    writer = Workload(stack, seed=21)
    writer.start()
    wait_until(lambda: writer.done >= 150 or writer.error, 90, "writes before the kill")
    started = process.read_pid_file(runner.pid_file(jobs, driver.SERVICE))
    os.kill(started.pid, signal.SIGKILL)  # mid-run: a batch may be written to Redis but not committed
    wait_until(lambda: not process.is_running(started), 30, "the driver to die")
    wait_until(lambda: writer.done >= 300 or writer.error, 90, "writes while the driver is down")
    runner.start_and_wait(jobs, [driver.SERVICE])  # replays the uncommitted batch
    wait_until(lambda: writer.done >= 450 or writer.error, 90, "writes after the restart")
    writer.finish()
    assert_equal_to_sql(jobs, pipeline, stack)

    # Replay the whole changelog into the synced cache: every change is applied a second time.
    process.stop(runner.pid_file(jobs, driver.SERVICE))
    shutil.rmtree(jobs.state_dir / "checkpoints" / "cache")
    runner.start_and_wait(jobs, [driver.SERVICE])
    wait_until(lambda: (jobs.state_dir / "checkpoints" / "cache" / "commits" / "0").exists(), 120, "a replayed batch")
    assert_equal_to_sql(jobs, pipeline, stack)


def test_verify_reports_an_aggregate_that_differs_from_group_by(run, stack):
    jobs, pipeline, _ = run
    cache = redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB)
    key = next(cache.scan_iter(match="customer:*:stats", count=1000))
    paid = cache.hget(key, "paid_total")
    cache.hset(key, "paid_total", str(Decimal(paid.decode()) + Decimal("0.01")))
    cache.zadd("top_products:units_sold", {"999999": 1})
    try:
        found = verify(jobs, pipeline=pipeline, tables=["orders"], sinks=["cache"])
        assert [(d.table, d.kind, d.examples) for d in found if d.table.startswith("aggregate:")] == [
            ("aggregate:customer_stats", "different", (key.decode().split(":")[1],)),
            ("aggregate:top_products", "extra", ("999999",)),
        ]
    finally:
        cache.hset(key, "paid_total", paid)
        cache.zrem("top_products:units_sold", "999999")
