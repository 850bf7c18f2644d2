"""`tide demo load` against a real PostgreSQL: paced, several connections, reproducible from the seed.

Each test gets its own database in the shared test stack's PostgreSQL (demo schema only),
so the rows it writes never reach another test's tables.
"""

from __future__ import annotations

import random
import uuid

import psycopg
import pytest

from services.db import migrate
from services.demo import load, workload
from services.settings import StackSettings
from services.stack import postgres

pytestmark = pytest.mark.stack


@pytest.fixture
def new_demo_db(stack: StackSettings):
    """Makes fresh databases at the demo schema (revision 0001); drops them afterwards."""
    made: list[str] = []

    def make() -> StackSettings:
        name = f"demo_load_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        settings = stack.model_copy(update={"postgres_db": name})
        migrate.upgrade(settings, "0001")
        return settings

    yield make
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as admin:
        for name in made:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _seeded(settings: StackSettings, seed: int) -> str:
    conninfo = postgres.conninfo(settings)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        workload.seed(conn, random.Random(seed))
    return conninfo


def _contents(conninfo: str) -> list[tuple]:
    with psycopg.connect(conninfo) as conn:
        return [
            *conn.execute("SELECT id, email, name, country FROM customers ORDER BY id").fetchall(),
            *conn.execute("SELECT id, customer_id, status::text, total FROM orders ORDER BY id").fetchall(),
            *conn.execute("SELECT order_id, line_no, product_id, quantity FROM order_items ORDER BY 1, 2").fetchall(),
            *conn.execute("SELECT id, price, md5(description) FROM products ORDER BY id").fetchall(),
        ]


def test_load_runs_the_asked_rate_on_several_connections(new_demo_db):
    conninfo = _seeded(new_demo_db(), seed=3)
    report = load.run(conninfo, rate=60, duration_s=4, seed=3, workers=3)
    assert report.errors == []
    assert report.done + report.idle + report.conflicts == 240  # every paced slot ran once
    assert 45 <= report.achieved_rate <= 66, report.as_dict()
    assert {"place order", "advance order", "new customer"} <= set(report.by_operation)
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] > 20  # seed placed 20


def test_same_seed_on_one_connection_gives_the_same_data(new_demo_db):
    runs = []
    for _ in range(2):
        conninfo = _seeded(new_demo_db(), seed=5)
        load.run(conninfo, rate=100, duration_s=2, seed=5, workers=1)
        runs.append(_contents(conninfo))
    assert runs[0] == runs[1]
    assert len(runs[0]) > 50


def test_the_workload_never_deletes_a_probe_customer(new_demo_db):
    conninfo = _seeded(new_demo_db(), seed=7)
    rnd = random.Random(7)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        probe = conn.execute(
            "INSERT INTO customers (email, name) VALUES (%s, 'probe') RETURNING id", (f"m1@{workload.PROBE_DOMAIN}",)
        ).fetchone()[0]
        unused = conn.execute("SELECT count(*) FROM customers c WHERE NOT EXISTS "
                              "(SELECT 1 FROM orders o WHERE o.customer_id = c.id)").fetchone()[0]
        deleted = [workload.delete_unused(conn, rnd) for _ in range(6 * unused)].count("delete customer")
        assert deleted == unused - 1  # every unused customer but the probe went
        assert conn.execute("SELECT count(*) FROM customers WHERE id = %s", (probe,)).fetchone()[0] == 1


def test_asked_more_than_it_can_run_it_ends_on_time_and_counts_the_row_changes(new_demo_db):
    conninfo = _seeded(new_demo_db(), seed=4)
    report = load.run(conninfo, rate=1_000_000, duration_s=3, seed=4, workers=4, processes=2)
    assert report.errors == []
    assert report.processes == 2 and report.operations > 0
    assert report.seconds < 30, report.as_dict()  # ended at its duration, not after a million slots
    # PostgreSQL's counters: an order placed is at least three (order, an item, its total)
    assert report.row_changes >= 3 * report.by_operation["place order"] > 0
