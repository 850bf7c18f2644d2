"""The cache's aggregates end to end: a replay of the whole changelog into the synced cache applies
every change a second time, and Redis still holds exactly what SQL GROUP BY computes (and every row
keeps its version). The same oracle runs after a kill -9 under concurrent writes in
test_derived_views.py.

The oracle is hand-written SQL of the definitions in pipeline.yaml (docs/sinks/redis.md, in
support.py), independent of the query `tide verify` generates from the declaration (which runs too).
"""

from __future__ import annotations

import shutil
from decimal import Decimal

import pytest
import redis

from services.jobs import driver
from services.stack import process, runner
from services.verify import verify
from tests.e2e.support import REDIS_DB, assert_aggregates_equal_group_by, converged, redis_versions
from tests.waiting import wait_until

pytestmark = pytest.mark.stack


def test_replaying_the_whole_changelog_into_the_synced_cache_changes_no_row_and_no_aggregate(run, stack):
    jobs, pipeline, first = run
    first.finish(stop=False)  # the session's first minute of writes (test_apply counts them) ends first
    converged(jobs, pipeline, sinks=["cache"])
    assert_aggregates_equal_group_by(stack)
    before = redis_versions(jobs, "customers", count=10_000)

    process.stop(runner.pid_file(jobs, driver.SERVICE))
    shutil.rmtree(jobs.state_dir / "checkpoints" / "cache")  # the cache query starts again at offset zero
    runner.start_and_wait(jobs, [driver.SERVICE])
    # The new checkpoint's query id names the group its writers publish to: converged waits for those
    # positions, not for the first epoch's commit (minutes in Real-Time Mode).
    wait_until(lambda: (jobs.state_dir / "checkpoints" / "cache" / "metadata").exists(), 120, "the cache query anew")
    converged(jobs, pipeline, sinks=["cache"])
    assert_aggregates_equal_group_by(stack)
    assert redis_versions(jobs, "customers", count=10_000) == before


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
