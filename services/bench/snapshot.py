"""Scenario `snapshot`: the initial snapshot of `rows` products into all three sinks.

The products are written straight into PostgreSQL before the connector exists
(names, prices, tags, attributes, and descriptions of 32 B to 1.9 KB, about 1 KB
on average), then the connector is registered (Debezium's initial snapshot) and
the jobs started. Every two seconds the benchmark records how many records are in
the topics and how many each sink's query has committed.
"""

from __future__ import annotations

import threading
from pathlib import Path

from services.bench import plots
from services.bench.core import Bench, BenchError, poll_until
from spark_jobs.pipeline import tables_with_view
from spark_jobs.settings import SINKS

NAME = "snapshot"
# timeout_s: a million rows took 24 min with 100,000-record batches, far longer with the default (docs/benchmarks.md)
DEFAULTS = {"rows": 1_000_000, "seed": 1, "timeout_s": 3600.0}
BATCH_ROWS = 50_000
SAMPLE_S = 2.0
COLUMNS = ["captured", *SINKS]  # analytics: the warehouse's history tables, its own query

INSERT_PRODUCTS = """
INSERT INTO products (sku, name, description, price, tags, attributes)
SELECT 'BENCH-' || lpad(g::text, 9, '0'),
       'Product ' || g,
       (SELECT string_agg(md5(g::text || '-' || c::text), '') FROM generate_series(1, 1 + (random() * 59)::int) c),
       round((1 + random() * 999)::numeric, 2),
       ARRAY['bench', (ARRAY['new', 'sale', 'eco', 'gift', 'bulk'])[1 + g %% 5]],
       jsonb_build_object('weight_g', g %% 5000, 'dims', jsonb_build_object('h', g %% 50))
FROM generate_series(%s::bigint, %s::bigint) g
"""


def fill_products(bench: Bench, rows: int, seed: int) -> dict:
    """Insert `rows` products in batches; returns the seconds taken and the table's size on disk."""
    began = bench.now()
    with bench.connect() as conn:
        conn.execute("SELECT setseed(%s)", (1 / (seed + 1),))
        for first in range(1, rows + 1, BATCH_ROWS):
            conn.execute(INSERT_PRODUCTS, (first, min(first + BATCH_ROWS - 1, rows)))
            bench.say(f"  {min(first + BATCH_ROWS - 1, rows):,} of {rows:,} products written")
        conn.execute("ANALYZE products")
        size = conn.execute(
            "SELECT pg_total_relation_size('products'), avg(octet_length(description))::int FROM products "
            "WHERE sku LIKE 'BENCH-%'"
        ).fetchone()
    return {"seconds": round(bench.now() - began, 1), "table_bytes": size[0], "description_mean_bytes": size[1]}


def targets(bench: Bench) -> dict[str, int]:
    """Per column, the records an initial snapshot brings it: a row of every captured table into the
    topics (`captured`), a row of every table a sink has a view of into that sink."""
    with bench.connect() as conn:
        rows = {table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] for table in bench.pipeline.tables}
    return {"captured": sum(rows.values()),
            **{sink: sum(rows[table] for table in tables_with_view(bench.pipeline, sink)) for sink in SINKS}}


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up()
    bench.seed_demo()  # customers, orders and items too, as a shop has: products are the bulk
    bench.say(f"writing {options['rows']:,} products")
    source = fill_products(bench, options["rows"], options["seed"])
    goal = targets(bench)
    rows = goal["captured"]

    series: list[list[float]] = []
    stop = threading.Event()
    began = bench.now()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            try:
                counts = bench.progress()
            except Exception:  # noqa: BLE001 - topics not created yet: nothing captured so far
                counts = dict.fromkeys(COLUMNS, 0)
            series.append([round(bench.now() - began, 1), *(counts[c] for c in COLUMNS)])
            if len(series) % 15 == 0:
                bench.record_load()
            if len(series) % 90 == 0:
                bench.record_others()  # every three minutes: who else uses the machine

    sampler = threading.Thread(target=sample, daemon=True, name="snapshot-progress")
    sampler.start()
    try:
        bench.capture_and_apply()
        jobs_ready = round(bench.now() - began, 1)
        bench.say(f"jobs running {jobs_ready}s after registration; waiting for every sink to hold its rows: {goal}")
        bench.record_others()
        try:
            poll_until(lambda: series and all(n >= goal[c] for c, n in zip(COLUMNS, series[-1][1:])),
                       options["timeout_s"], f"every sink to apply its rows {goal}", 2.0)
            timed_out = None
        except BenchError as exc:  # the progress so far is still a result; verify then shows what is missing
            timed_out = str(exc)
            bench.say(timed_out)
    finally:
        stop.set()
        sampler.join(timeout=30)
    return {
        "products_written": options["rows"],
        "rows": rows,
        "targets": goal,
        "source": source,
        "jobs_ready_s": jobs_ready,
        "timed_out": timed_out,
        "completion": completion(series, COLUMNS, goal),
        "progress_columns": ["seconds", *COLUMNS],
        "progress": series,
    }


def completion(series: list[list[float]], columns: list[str], goal: dict[str, int]) -> dict[str, dict]:
    """Per column: seconds until it reached its goal (from registration) and the mean rows/s over that time."""
    result = {}
    for index, name in enumerate(columns, start=1):
        done_at = next((row[0] for row in series if row[index] >= goal[name]), None)
        result[name] = {
            "rows": goal[name],
            "seconds_to_all_rows": done_at,
            "rows_per_s": round(goal[name] / done_at, 1) if done_at else None,
            "peak_rows_per_s": peak_rate(series, index),
        }
    return result


def peak_rate(series: list[list[float]], index: int, window: int = 5) -> float | None:
    """The highest rate over `window` consecutive samples (smooths the micro-batch steps)."""
    rates = [
        (series[i + window][index] - series[i][index]) / (series[i + window][0] - series[i][0])
        for i in range(len(series) - window) if series[i + window][0] > series[i][0]
    ]
    return round(max(rates), 1) if rates else None


def plot(result: dict, out_dir: Path) -> list[Path]:
    data = result["results"]
    return [
        plots.progress(data["progress"], data["progress_columns"][1:], out_dir / "snapshot-progress.png",
                       f"Initial snapshot: {data['rows']:,} rows ({data['products_written']:,} products written)",
                       data["rows"]),
        plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component"),
    ]
