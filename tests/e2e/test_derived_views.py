"""The warehouse's derived views end to end, on the session's apply run (conftest.py `run`):
SCD2 history against versions recorded by PostgreSQL itself, and every derived view (nested orders,
Redis aggregates, history, windows) clean under verify, through a kill -9 and replayed batches;
event-time windows against SQL, with late orders recorded apart; a bad window column at start-up.

The oracle for history is an audit trigger installed by the test: it records, inside each writing
transaction, every version of every customer and product row, so it sees exactly the committed
versions, in commit order per row (row locks order the writers of one row), with no Debezium,
Kafka or Spark involved.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.db import migrate
from services.jobs import driver
from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.verify import nested
from services.verify.readers import warehouse_query
from spark_jobs.model import catalogue as source_catalogue
from spark_jobs.model.config import history_table, load
from spark_jobs.model.event_windows import window_starts
from spark_jobs.model.settings import SINKS
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from tests.demo_catalogue import demo_catalogue
from tests.e2e.support import (
    CONVERGE_S,
    Workload,
    assert_aggregates_equal_group_by,
    caught_up,
    converged,
    kill_9_driver,
    tide,
    tide_result,
    write_pipeline,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

# The columns compared per table, as text (descriptions as their md5: they are up to 22 KB).
COMPARED = {
    "customers": {"email": "NEW.email", "name": "NEW.name", "country": "NEW.country"},
    "products": {"sku": "NEW.sku", "name": "NEW.name", "price": "NEW.price::text",
                 "description": "md5(NEW.description)"},
}
OPS = {"INSERT": "c", "UPDATE": "u", "DELETE": "d"}


def _install_audit(conn: psycopg.Connection) -> None:
    conn.execute("DROP TABLE IF EXISTS test_history_audit")
    conn.execute("CREATE TABLE test_history_audit "
                 "(seq bigserial PRIMARY KEY, tbl text, row_id bigint, op text, image jsonb)")
    for table, columns in COMPARED.items():
        image = ", ".join(f"'{name}', {expr}" for name, expr in columns.items())
        conn.execute(f"""
            CREATE OR REPLACE FUNCTION test_audit_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF TG_OP = 'DELETE' THEN
                INSERT INTO test_history_audit (tbl, row_id, op, image) VALUES (TG_TABLE_NAME, OLD.id, TG_OP, NULL);
              ELSE
                INSERT INTO test_history_audit (tbl, row_id, op, image)
                VALUES (TG_TABLE_NAME, NEW.id, TG_OP, jsonb_build_object({image}));
              END IF;
              RETURN NULL;
            END $$""")
        conn.execute(f"DROP TRIGGER IF EXISTS test_audit ON {table}")
        conn.execute(f"CREATE TRIGGER test_audit AFTER INSERT OR UPDATE OR DELETE ON {table} "
                     f"FOR EACH ROW EXECUTE FUNCTION test_audit_{table}()")


def _drop_audit(conn: psycopg.Connection) -> None:
    for table in COMPARED:
        conn.execute(f"DROP TRIGGER IF EXISTS test_audit ON {table}")
    conn.execute("DROP TABLE IF EXISTS test_history_audit")


def _audited(conn: psycopg.Connection) -> dict[tuple[str, int], list[tuple[str, dict | None]]]:
    found: dict[tuple[str, int], list[tuple[str, dict | None]]] = {}
    for table, row_id, op, image in conn.execute("SELECT tbl, row_id, op, image FROM test_history_audit ORDER BY seq"):
        found.setdefault((table, row_id), []).append((OPS[op], image))
    return found


def _last_batch(commits) -> int:
    """The newest micro-batch a query's checkpoint records as done (-1 for none)."""
    return max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1) if commits.exists() else -1


def _warehouse(jobs: StackSettings, table: str, sql: str = "SELECT * FROM t") -> list[dict]:
    """The rows of `sql` over the warehouse table `table` (named `t`), read with delta-rs as verify reads it."""
    return list(warehouse_query(jobs.state_dir / "warehouse" / table, sql))


def _history(jobs: StackSettings, table: str) -> dict[int, list[dict]]:
    """Each row's stored versions in version order, with the compared columns as the trigger renders them."""
    order = f'ORDER BY id, "{VERSION_MAJOR}", "{VERSION_MINOR}"'
    rendered = {"price": lambda price: None if price is None else str(price),
                "description": lambda text: None if text is None else hashlib.md5(text.encode()).hexdigest()}
    found: dict[int, list[dict]] = {}
    for row in _warehouse(jobs, history_table(table), f"SELECT * FROM t {order}"):
        version = {name: row[name] for name in ("id", "source_op", "valid_from", VERSION_MAJOR, VERSION_MINOR)}
        version |= {name: rendered.get(name, lambda value: value)(row[name]) for name in COMPARED[table]}
        found.setdefault(row["id"], []).append(version)
    return found


def _as_audited(version: dict, table: str) -> tuple[str, dict | None]:
    if version["source_op"] == "d":
        return "d", None
    return version["source_op"], {name: version[name] for name in COMPARED[table]}


def _replay_last_batch(checkpoint: Path) -> None:
    """Make a query replay the last batch it wrote: as if the kill had come after the sink's writes
    and before Spark recorded the batch as done."""
    commits = checkpoint / "commits"
    if _last_batch(commits) < 0:
        return
    last = commits / str(_last_batch(commits))
    last.unlink()
    (commits / f".{last.name}.crc").unlink(missing_ok=True)


def test_every_derived_view_converges_and_history_holds_each_version_once_through_a_kill_9_and_replays(
    run, stack
):
    """Issue 5's acceptance on the session's pipeline: the writer changes every demo table (renames,
    status changes, item edits, deletes) through a kill -9 of the driver and a replay of each query's
    last written batch; then verify is clean for every table, the nested orders, the Redis aggregates
    (a double count would show; checked against hand-written GROUP BY as well), the history and window
    tables; and history holds each committed
    version once. The API serves the history and window tables Spark wrote."""
    jobs, pipeline, first = run
    first.finish(stop=False)  # the session's first minute of writes (test_apply counts them) ends first
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        _install_audit(conn)
        installed_at = conn.execute("SELECT now()").fetchone()[0]
    try:
        commits = jobs.state_dir / "checkpoints" / "analytics" / "commits"  # the query writing history
        done_before = _last_batch(commits)
        writer = Workload(stack, seed=21)
        writer.start()
        wait_until(lambda: writer.done >= 150 and _last_batch(commits) > done_before, CONVERGE_S,
                   "writes, and an analytics batch of them, before the kill")
        kill_9_driver(jobs)
        for sink in SINKS:
            _replay_last_batch(jobs.state_dir / "checkpoints" / sink)
        wait_until(lambda: writer.done >= 350, 90, "writes while the driver is down")
        runner.start_and_wait(jobs, [driver.SERVICE])
        writer.finish()
        outcomes = converged(jobs, pipeline)  # every table and view
        assert_aggregates_equal_group_by(stack)  # by hand-written SQL too, not only verify's generated query
        with psycopg.connect(postgres.conninfo(stack)) as conn:
            audited = _audited(conn)
    finally:
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
            _drop_audit(conn)

    checked = {(outcome.table, outcome.sink) for outcome in outcomes}
    assert {("customers", "history"), ("products", "history"), ("order_revenue", "windows"),
            ("aggregate:customer_stats", "cache"), ("aggregate:top_products", "cache"),
            *((nested.label(name), "search") for name in pipeline.nested)} <= checked, checked
    assert sum(len(v) for v in audited.values()) > 100, "the writer changed too few customers and products"
    for table in COMPARED:
        stored = _history(jobs, table)
        for row_id, versions in stored.items():
            keys = [(v[VERSION_MAJOR], v[VERSION_MINOR]) for v in versions]
            assert len(set(keys)) == len(keys), f"{table} {row_id}: a version is stored twice: {keys}"
        for row_id in {r for t, r in audited if t == table} | set(stored):
            expected = audited.get((table, row_id), [])
            versions = stored.get(row_id, [])
            tail = versions[len(versions) - len(expected):] if expected else []
            assert [_as_audited(v, table) for v in tail] == expected, f"{table} {row_id}: versions differ"
            earlier = versions[: len(versions) - len(expected)]
            assert all(v["valid_from"] <= installed_at for v in earlier), \
                f"{table} {row_id}: an unaudited later version"
    with TestClient(create_app(jobs, pipeline)) as api:  # the API reads what Spark wrote, as it reads any table
        for name in (history_table("customers"), "order_revenue"):
            served = api.get(f"/warehouse/{name}", params={"limit": 1}).json()
            stored = _warehouse(jobs, name, "SELECT count(*) AS n FROM t")[0]["n"]
            assert served["total"] == stored > 0 and len(served["rows"]) == 1, (name, served, stored)


def _figures(jobs: StackSettings, name: str) -> dict:
    return {(r["window_size_seconds"], r["window_slide_seconds"], r["window_start"]): r for r in _warehouse(jobs, name)}


def test_late_orders_are_recorded_apart_and_on_time_orders_move_their_window(run, stack):
    jobs, pipeline, first = run
    first.finish(stop=False)  # the session's first minute of writes (test_apply counts them) ends first
    view = pipeline.windows["order_revenue"]
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        customer = conn.execute("SELECT min(id) FROM customers").fetchone()[0]
        now = conn.execute("SELECT now()").fetchone()[0]
    before = _figures(jobs, "order_revenue")
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        on_time = conn.execute("INSERT INTO orders (customer_id, status, total) VALUES (%s, 'paid', 10.00) "
                               "RETURNING id, created_at", (customer,)).fetchone()
    on_time_minute = (60, 60, window_starts(on_time[1], view.windows[0])[0])
    counted = (before[on_time_minute]["row_count"] if on_time_minute in before else 0) + 1
    wait_until(lambda: _figures(jobs, "order_revenue")[on_time_minute]["row_count"] == counted,
               180, "the on-time order in its window")
    # The watermark is now at most two minutes behind that order: a quarter of an hour back is late.
    late_at = now - timedelta(minutes=15)
    late_windows = {(w.size_seconds, w.slide, s) for w in view.windows for s in window_starts(late_at, w)}
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        late_id = conn.execute("INSERT INTO orders (customer_id, status, total, created_at) "
                               "VALUES (%s, 'paid', 123.45, %s) "
                               "RETURNING id", (customer, late_at)).fetchone()[0]

    def recorded():
        return _warehouse(jobs, "order_revenue_late", f"SELECT * FROM t WHERE row_id = '{late_id}'")

    records = wait_until(recorded, 180, "the late order's record")
    after = _figures(jobs, "order_revenue")
    assert {(r["window_size_seconds"], r["window_slide_seconds"], r["window_start"]) for r in records} \
        == late_windows, "one record per closed window the late order falls in"
    assert all(r["value_delta"] == Decimal("123.45") and r["count_delta"] == 1 for r in records)
    assert "window closed" in records[0]["reason"]
    assert {k: after.get(k) for k in late_windows} == {k: before.get(k) for k in late_windows}, \
        "closed windows keep their figures"
    converged(jobs, pipeline, tables=["orders"])  # verify: figures + late deltas = SQL over the orders now
    for label, windows in (("late order", sorted(late_windows)), ("on-time order", [on_time_minute])):
        for key in windows:  # the figures docs/sinks/delta.md shows
            print(label, key, "before", _pair(before.get(key)), "after", _pair(after.get(key)),
                  "late", [(r["value_delta"], r["count_delta"]) for r in records if r["window_start"] == key[2]
                           and r["window_size_seconds"] == key[0]])


def _pair(row) -> tuple | None:
    return None if row is None else (row["value_sum"], row["row_count"])


def _created_at(table: Path) -> float:
    """When the Delta table at `table` was created: its first commit's modification time."""
    return (table / "_delta_log" / f"{0:020d}.json").stat().st_mtime


def test_tide_rebuild_analytics_rebuilds_history_and_windows_from_the_topics_and_keeps_the_current_state(
    run, stack
):
    jobs, pipeline, first = run
    first.finish(stop=False)  # the session's first minute of writes (test_apply counts them) ends first
    warehouse = jobs.state_dir / "warehouse"
    rebuilt = [warehouse / history_table(table) for table in pipeline.history_tables()] + [warehouse / "order_revenue"]
    kept = [warehouse / table for table in pipeline.tables]
    caught_up(jobs, pipeline, CONVERGE_S, sinks=["warehouse", "analytics"])  # every table exists
    created = {table: _created_at(table) for table in rebuilt + kept}
    tide(jobs, "rebuild", "analytics")
    converged(jobs, pipeline, sinks=["analytics"])  # history and windows equal PostgreSQL again
    assert all(_created_at(table) > created[table] for table in rebuilt), "history and windows were built anew"
    assert all(_created_at(table) == created[table] for table in kept), "the current state is not analytics' to clear"


def test_a_window_on_an_unknown_column_stops_tide_jobs_start_with_one_line(stack, tmp_path):
    migrate.upgrade(stack)
    pipeline = load(stack.pipeline_file)
    view = pipeline.windows["order_revenue"].model_copy(update={"time_column": "placed_at"})
    write_pipeline(pipeline.model_copy(update={"windows": {"order_revenue": view}}), tmp_path / "pipeline.yaml")
    # The stack's own state folder: `tide jobs start` checks the stack's services through it. The
    # session's driver runs from a folder of its own (conftest.py), so no driver is there to find.
    jobs = stack.model_copy(update={"pipeline_file": tmp_path / "pipeline.yaml"})
    result = tide_result(jobs, "jobs", "start")
    assert result.returncode == 1, result.stdout + result.stderr
    error = result.stderr.strip()
    assert "windows.order_revenue.time_column: orders has no column placed_at (columns: created_at, " in error, error
    assert "created_at" in error and len(error.splitlines()) == 1, error
    assert not process.running(runner.pid_file(jobs, driver.SERVICE)), "no driver may start with a bad pipeline"


def test_postgresqls_catalogue_agrees_with_the_models_on_every_captured_table(stack):
    """The jobs type every view from PostgreSQL's catalogue (spark_jobs/model/catalogue.py), the unit tests from
    migrations/models.py (tests/demo_catalogue.py): both must describe the captured tables' modelled columns
    alike (kinds, scales, enum labels) and their primary keys."""
    migrate.upgrade(stack)
    pipeline = load(stack.pipeline_file)
    with psycopg.connect(postgres.conninfo(stack)) as conn:
        catalogue = source_catalogue.read(conn, pipeline.source.schema_name)
    models = demo_catalogue()
    for table in pipeline.tables:  # a column added by another test (ALTER TABLE) is in the catalogue only
        found = catalogue[table]
        assert found.primary_key == models[table].primary_key, table
        assert {c: found.columns.get(c) for c in models[table].columns} == models[table].columns, table
