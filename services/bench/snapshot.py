"""Scenario `snapshot`: the initial snapshot of `rows` products into every sink.

The products are written straight into PostgreSQL before the connector exists
(names, prices, tags, attributes, and descriptions of 32 B to 1.9 KB, about 1 KB
on average). PostgreSQL alone then reads every captured table out once (the read
ceiling), the connector is registered (Debezium's initial snapshot) and the jobs
started. Every two seconds the benchmark records how many records are in the
topics and how many each sink's query has committed.

With `capture_only` no Spark job runs and no Elasticsearch or Redis starts: the
capture stage alone (time until Kafka holds every row, sampled every half second),
which is how capture settings are measured (`--connector KEY=VALUE`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from services.bench import plots
from services.bench.baseline import read_ceiling
from services.bench.core import CAPTURE_SERVICES, Bench, BenchError, poll_until
from services.bench.measure import ratios
from services.stack.rows import one_row, scalar

NAME = "snapshot"
# timeout_s: a million rows took 24 min with 100,000-record batches, far longer with the default (docs/benchmarks.md)
DEFAULTS = {"rows": 1_000_000, "seed": 1, "timeout_s": 3600.0, "capture_only": False}
BATCH_ROWS = 50_000
SAMPLE_S = {False: 2.0, True: 0.5}  # capture only: a million rows take about a minute, so sample finer

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
        size = one_row(
            conn,
            "SELECT pg_total_relation_size('products'), avg(octet_length(description))::int FROM products "
            "WHERE sku LIKE 'BENCH-%'",
        )
    return {"seconds": round(bench.now() - began, 1), "table_bytes": size[0], "description_mean_bytes": size[1]}


def targets(bench: Bench) -> dict[str, int]:
    """Per column, the records an initial snapshot brings it: a row of every captured table into the
    topics (`captured`), a row of every table a sink has a view of into that sink."""
    with bench.connect() as conn:
        rows = {table: scalar(conn, f'SELECT count(*) FROM "{table}"') for table in bench.pipeline.tables}
    return {"captured": sum(rows.values()),
            **{sink: sum(rows[table] for table in bench.pipeline.sink_tables(sink)) for sink in bench.sinks}}


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    capture_only = options["capture_only"]
    columns = ["captured"] if capture_only else ["captured", *bench.sinks]  # analytics: the history tables
    bench.up(CAPTURE_SERVICES if capture_only else None)
    bench.seed_demo()  # customers, orders and items too, as a shop has: products are the bulk
    bench.say(f"writing {options['rows']:,} products")
    source = fill_products(bench, options["rows"], options["seed"])
    goal = {column: rows for column, rows in targets(bench).items() if column in columns}
    bench.say("PostgreSQL alone reads every captured table out (the read ceiling)")
    ceiling = read_ceiling(bench)
    bench.say(f"  {ceiling['rows']:,} rows in {ceiling['seconds']} s ({ceiling['rows_per_s']:,.0f} rows/s)")

    series: list[list[float]] = []
    stop = threading.Event()
    began = bench.now()

    def sample() -> None:
        while not stop.wait(SAMPLE_S[capture_only]):
            try:
                counts = bench.progress(sinks=() if capture_only else bench.sinks)
            except Exception:  # noqa: BLE001 - topics not created yet: nothing captured so far
                counts = dict.fromkeys(columns, 0)
            series.append([round(bench.now() - began, 1), *(counts[c] for c in columns)])
            if len(series) % 15 == 0:
                bench.record_load()
            if len(series) % 90 == 0:
                bench.record_others()  # every few minutes: who else uses the machine

    sampler = threading.Thread(target=sample, daemon=True, name="snapshot-progress")
    sampler.start()
    jobs_ready = None
    try:
        bench.capture()
        if not capture_only:
            bench.apply()
            jobs_ready = round(bench.now() - began, 1)
            bench.say(f"jobs running {jobs_ready}s after registration")
        bench.say(f"waiting for every stage to hold its rows: {goal}")
        bench.record_others()
        try:
            poll_until(lambda: series and all(n >= goal[c] for c, n in zip(columns, series[-1][1:], strict=True)),
                       options["timeout_s"], f"every stage to hold its rows {goal}", SAMPLE_S[capture_only])
            timed_out = None
        except BenchError as exc:  # the progress so far is still a result; verify then shows what is missing
            timed_out = str(exc)
            bench.say(timed_out)
    finally:
        stop.set()
        sampler.join(timeout=30)
    done = completion(series, columns, goal)
    rates = {column: done[column]["rows_per_s"] for column in columns}
    captured_in = done["captured"]["seconds_to_all_rows"]
    return {
        "capture_only": capture_only,
        "products_written": options["rows"],
        "rows": goal["captured"],
        "targets": goal,
        "source": source,
        "read_ceiling": ceiling,
        "jobs_ready_s": jobs_ready,
        "timed_out": timed_out,
        "completion": done,
        "capture_cpu": capture_cpu(bench.components_between(began, began + captured_in), captured_in, goal["captured"])
        if captured_in else None,
        "ratios": {"of_read_ceiling": ratios(rates, ceiling["rows_per_s"]),
                   "of_capture": ratios({c: rates[c] for c in columns[1:]}, rates["captured"])},
        "progress_columns": ["seconds", *columns],
        "progress": series,
    }


def capture_cpu(components: dict[str, dict[str, float]], seconds: float, rows: int) -> dict:
    """CPU the capture stage's components used while it took the snapshot: per component and in all,
    milliseconds of CPU per 1,000 rows. Less at the mercy of other load than rows/s: on a shared
    machine a setting's effect shows here even when the wall clock is noisy."""
    used = {name: components[name]["cpu_mean_percent"] / 100 * seconds
            for name in CAPTURE_SERVICES if name in components}
    return {"cpu_s": {name: round(cpu, 1) for name, cpu in used.items()},
            "ms_per_1000_rows": {name: round(1e6 * cpu / rows, 1) for name, cpu in used.items()},
            "total_ms_per_1000_rows": round(1e6 * sum(used.values()) / rows, 1)}


def check(bench: Bench, results: dict) -> dict:
    """Capture only: every row is in the topics. Otherwise `tide verify`, waiting for the sinks at
    the rates this run measured."""
    if not results["capture_only"]:
        return bench.verify(rates={sink: done["rows_per_s"] for sink, done in results["completion"].items()})
    captured = results["progress"][-1][1] if results["progress"] else 0
    return {"clean": captured >= results["targets"]["captured"], "captured": captured,
            "expected": results["targets"]["captured"]}


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
                       data["rows"], "seconds since the connector was registered"),
        plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component"),
    ]
