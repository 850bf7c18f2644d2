"""Spark jobs, stages and time per micro-batch of one sink's query, without Kafka.

Synthetic Debezium records (the layout of tests/unit/fixtures/debezium_records.json; without Connect's
schema, as the pipeline's connector writes them, or with it for main's Python decoder, which needs it)
are built in Spark SQL for the four demo tables and handed to the sink the way the query's foreachBatch
does. Each batch runs in a job group; the status tracker lists its jobs and their stages. At the end it
prints the CPU time the local Python workers used (their processes, read from /proc). Search and cache write to the
stores of TIDE_JOB_ELASTICSEARCH_URL / TIDE_JOB_REDIS_URL (e.g. a stack's, `tide up`);
BENCH_NO_NESTED=1 leaves the nested views out of the pipeline (the search sink's flat writes alone).

- this tree (`spark_jobs.sinks.delta.warehouse` exists): decode_stream → the pipeline's `batch_frames` (the
  changes and the newest per row, persisted for a sink that is not SINGLE_PASS) → `sink.write(Batch)` → a count of the
  returned rejects, standing in for the pipeline's dead-letter write (one job either way);
- with TIDE_JOB_KAFKA_BOOTSTRAP set: the query's own foreachBatch body (`BatchWriter._apply`: coalesced
  records, a single pass where the sink allows, dead letters written to that Kafka), the catalogue
  fixed to the demo's;
- main's tree: main's `BatchWriter("warehouse" | "analytics", ...)` itself, which decodes in Python.

Usage (PYTHONPATH = the tree to measure):
    python bench/sink_batches.py jobs --sink warehouse|analytics|search|cache|changes --batches 4 --rows 2000
    python bench/sink_batches.py load --seed 1000000 --batch 50000 --batches 3 [--table orders] [--tombstones N]
    (either mode: --property k=v, --conf k=v; --optimize-every N compacts the tables after every N batches)
Prints one JSON line per batch: rows, seconds, jobs, stages (run and skipped), load average, the
seconds Catalyst's rules took (analysis and optimisation), Janino compilations and their seconds;
`--sink changes` measures issue 34's alternative design: the batch's changes of every table appended once
to one Delta table (docs/sinks/delta.md, "An append-only changes table"). BENCH_DETAIL=1 adds each
job's description (Delta's names for its passes). BENCH_STAGES=1 adds each stage's tasks, wall, run
and CPU milliseconds, BENCH_RULES=1 prints the time per rule to stderr; BENCH_SPREAD_TIMES=1 spreads orders'
created_at a second apart by key (event-time windows over a timeline, not one window).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("TIDE_TREE", Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(ROOT))

# bench/, beside this script
from proc_cpu import print_python_workers_cpu, process_cpu  # noqa: E402
from sink_optimize import optimize_every  # noqa: E402

# Records with Connect's schema, which both decoders read: this tree keeps them apart from its schemaless ones.
_WITH_SCHEMA = ROOT / "tests/unit/fixtures/debezium_records_with_schema.json"
FIXTURES = json.loads(
    (_WITH_SCHEMA if _WITH_SCHEMA.exists() else ROOT / "tests/unit/fixtures/debezium_records.json").read_text())
TEMPLATES = {"orders": "orders_update", "order_items": "order_items_delete", "customers": "customers_snapshot",
             "products": "products_insert"}
SHARES = {"orders": 0.4, "order_items": 0.4, "customers": 0.1, "products": 0.1}


def _schemas(name: str) -> tuple[str, str]:
    record = next(r for r in FIXTURES if r["name"] == name)
    return json.dumps(json.loads(record["value"])["schema"]), json.dumps(json.loads(record["key"])["schema"])


def records(spark, table: str, first_key: int, count: int, op: str, major: int, keyspace: int | None = None):
    """`count` Kafka-shaped records (topic, partition, offset, key, value) of `table`: keys from
    `first_key` on (or random below `keyspace`), op 'r' (snapshot) or 'u'/'c'/'d', version (major, n)."""
    from pyspark.sql import functions as F

    value_schema, key_schema = _schemas(TEMPLATES[table])
    key = (F.col("id") + first_key) if keyspace is None else (F.rand(major) * keyspace).cast("bigint") + 1
    rows = spark.range(count).select(key.alias("k"), F.col("id").alias("n"))
    rows = rows if keyspace is None else rows.dropDuplicates(["k"])
    stamp = F.lit("2026-11-22T06:55:32.386297Z")
    created = (F.date_format(F.timestamp_seconds(F.col("k") + 1_763_794_532), "yyyy-MM-dd'T'HH:mm:ss'Z'")
               if os.environ.get("BENCH_SPREAD_TIMES") else stamp)  # orders a second apart by key
    after = {
        "orders": F.struct(F.col("k").alias("id"), (F.col("k") % 1000).alias("customer_id"),
                           F.lit("paid").alias("status"), F.format_string("%d.50", F.col("k") % 997).alias("total"),
                           created.alias("created_at"), stamp.alias("updated_at")),
        "order_items": F.struct(F.col("k").alias("order_id"), F.lit(1).alias("line_no"),
                                (F.col("k") % 500).alias("product_id"), (F.col("k") % 7).alias("quantity"),
                                F.lit("3.25").alias("unit_price")),
        "customers": F.struct(F.col("k").alias("id"), F.concat(F.lit("c"), F.col("k"), F.lit("@x.io")).alias("email"),
                              F.lit("Name").alias("name"), F.lit("FR").alias("country"), stamp.alias("created_at"),
                              stamp.alias("updated_at")),
        "products": F.struct(F.col("k").alias("id"), F.concat(F.lit("SKU-"), F.col("k")).alias("sku"),
                             F.lit("Mug").alias("name"), F.repeat(F.lit("description "), 20).alias("description"),
                             F.lit("12.50").alias("price"),
                             F.array(F.lit("kitchen")).alias("tags"), F.lit('{"color": "blue"}').alias("attributes"),
                             stamp.alias("updated_at")),
    }[table]
    keys = (F.struct(F.col("k").alias("order_id"), F.lit(1).alias("line_no")) if table == "order_items"
            else F.struct(F.col("k").alias("id")))
    lsn = F.lit(major * 100_000) + F.col("n")  # below 2^53 (Redis Lua compares exactly up to there)
    sequence = F.to_json(F.array(F.lit(None).cast("string") if op == "r" else F.lit(str(major)), lsn.cast("string")))
    source = F.struct(F.lit(table).alias("table"), lsn.alias("lsn"), sequence.alias("sequence"),
                      F.lit("true" if op == "r" else "false").alias("snapshot"),
                      F.lit(1_763_794_532_386).alias("ts_ms"), F.lit(1).alias("txId"))
    payload = F.struct(F.lit(None).alias("before"), (F.lit(None) if op == "d" else after).alias("after"),
                       source.alias("source"), F.lit(op).alias("op"))
    value, key_json = F.to_json(payload), F.to_json(keys)
    if not _new_tree():  # main's Python decoder reads Connect's schema; this tree's records have none
        value = F.concat(F.lit('{"schema":' + value_schema + ',"payload":'), value, F.lit("}"))
        key_json = F.concat(F.lit('{"schema":' + key_schema + ',"payload":'), key_json, F.lit("}"))
    return rows.select(F.lit(f"tideline.public.{table}").alias("topic"),
                       (F.col("k") % 3).cast("int").alias("partition"),
                       F.col("n").alias("offset"), key_json.cast("binary").alias("key"),
                       value.cast("binary").alias("value"))


def batch_records(spark, total: int, op: str, major: int, keyspace: int | None, tables: list[str], first_key: int = 1):
    from functools import reduce

    shares = {table: share for table, share in SHARES.items() if table in tables}
    scale = 1 / sum(shares.values())
    parts = [records(spark, table, first_key, max(1, int(total * share * scale)), op, major + index, keyspace)
             for index, (table, share) in enumerate(shares.items())]
    return reduce(lambda a, b: a.unionByName(b), parts)


def _new_tree() -> bool:
    try:
        import spark_jobs.sinks.delta.warehouse  # noqa: F401
    except ImportError:
        return False
    return True


class Runner:
    """Applies one batch of Kafka-shaped records through the sink as the query would."""

    def __init__(self, spark, sink_name: str, warehouse: str, properties: dict[str, str]) -> None:
        from spark_jobs.model.config import load

        self.spark, self.sink_name = spark, sink_name
        if sink_name == "changes":  # issue 34's alternative: one append of the batch's changes, every table
            self.new, self.changes_path = True, f"{warehouse}/_tideline/changes"
            return
        pipeline = load(ROOT / "pipeline.yaml")
        if os.environ.get("BENCH_NO_NESTED"):  # the search sink's flat writes alone
            pipeline = pipeline.model_copy(update={"nested": {}})
        self.new = _new_tree()
        if self.new:
            from spark_jobs.model.settings import JobSettings
            from spark_jobs.sinks.base import build_sink
            from tests.demo_catalogue import demo_catalogue

            self.catalogue = demo_catalogue()
            # Search and cache write to the stores named by TIDE_JOB_ELASTICSEARCH_URL / TIDE_JOB_REDIS_URL.
            # Before the sink is built: its tables take a copy of TABLE_PROPERTIES when it is.
            self._tables_properties(properties)
            self.sink = build_sink(sink_name, JobSettings(warehouse_dir=Path(warehouse)), pipeline)
            self.sink.setup(spark, self.catalogue)
            self._check_properties(properties)
        else:
            from spark_jobs.model.settings import JobSettings
            from spark_jobs.pipeline import BatchWriter

            settings = JobSettings(warehouse_dir=Path(warehouse), kafka_bootstrap="127.0.0.1:1")
            # main's API (a tree before the sink rewrite, TIDE_TREE), not this tree's
            self.writer = BatchWriter(sink_name, settings, pipeline)  # type: ignore[arg-type]
            self.writer.sink.setup(pipeline)  # type: ignore[call-arg, arg-type]

    def _through_pipeline(self, kafka, batch_id: int) -> None:
        """The query's own foreachBatch body (coalesce, single pass, dead letters written to Kafka)."""
        from spark_jobs.model.settings import JobSettings
        from spark_jobs.pipeline import BatchWriter

        class Fixed:  # the catalogue without PostgreSQL
            def __init__(self, catalogue) -> None:
                self.catalogue = catalogue

            def current(self):
                return self.catalogue

        # duck-typed: Fixed has the one method of LiveCatalogue the batch writer calls
        BatchWriter(self.sink, JobSettings(), Fixed(self.catalogue))._apply(kafka, batch_id)  # type: ignore[arg-type]

    def _tables_properties(self, properties: dict[str, str]) -> None:
        from spark_jobs.sinks.delta import _tables

        _tables.TABLE_PROPERTIES.update(properties)

    def _check_properties(self, properties: dict[str, str]) -> None:
        """Stop unless every Delta table of the sink holds the --property settings (read back from its log)."""
        if not properties:
            return
        from delta.tables import DeltaTable

        from spark_jobs.sinks.delta.maintenance import delta_tables

        for path in delta_tables(self.sink.folders()):
            held = DeltaTable.forPath(self.spark, path).detail().collect()[0]["properties"]
            missing = {key: value for key, value in properties.items() if held.get(key) != value}
            if missing:
                raise SystemExit(f"{path} does not hold {missing} (it holds {held})")

    def apply(self, kafka, batch_id: int) -> None:
        if not self.new:
            self.writer(kafka, batch_id)
            return
        if self.sink_name == "changes":
            self._append_changes(kafka, batch_id)
            return
        if os.environ.get("TIDE_JOB_KAFKA_BOOTSTRAP"):
            self._through_pipeline(kafka, batch_id)
            return
        from pyspark.sql import functions as F

        from spark_jobs.changes.stream import decode_stream
        from spark_jobs.pipeline import batch_frames
        from spark_jobs.sinks.base import Batch

        with batch_frames(decode_stream(kafka, self.sink.tables()), self.sink) as (every, newest):
            good = F.col("error").isNull()
            rejected = self.sink.write(Batch(batch_id, self.spark, newest.where(good), every.where(good),
                                             self.catalogue))
            letters = newest.where(~good).select("origin")
            if rejected is not None:
                letters = letters.unionByName(rejected.select("origin"))
            letters.count()  # the pipeline's dead-letter write: one job

    def _append_changes(self, kafka, batch_id: int) -> None:
        """The batch's decoded changes of every table in one idempotent Delta append (one job, one commit)."""
        from spark_jobs.changes.stream import decode_stream
        from spark_jobs.sinks.delta._tables import tune_session

        tune_session(self.spark)
        (decode_stream(kafka, list(SHARES)).where("error IS NULL").drop("origin").write.format("delta").mode("append")
         .option("txnAppId", "bench").option("txnVersion", batch_id).save(self.changes_path))


def measure(spark, runner: Runner, kafka, batch_id: int, rows: int) -> dict:
    sc = spark.sparkContext
    group = f"bench-{batch_id}-{time.monotonic_ns()}"
    sc.setJobGroup(group, "bench batch")
    rules = spark._jvm.org.apache.spark.sql.catalyst.rules.RuleExecutor
    codegen = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    rules.resetMetrics()
    compiled_before = _compiled(codegen)
    jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
    cpu_before = process_cpu(jvm), process_cpu(os.getpid())
    started = time.monotonic()
    runner.apply(kafka, batch_id)
    seconds = time.monotonic() - started
    cpu_after = process_cpu(jvm), process_cpu(os.getpid())
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    stages, ran = set(), set()
    for job in jobs:
        info = tracker.getJobInfo(job)
        if info:
            stages.update(info.stageIds)
    for stage in stages:
        info = tracker.getStageInfo(stage)
        if info and info.numTasks and (info.numCompletedTasks + info.numFailedTasks) > 0:
            ran.add(stage)
    found = {"batch": batch_id, "rows": rows, "seconds": round(seconds, 2), "jobs": len(jobs), "stages": len(stages),
             "stages_run": len(ran), "load": os.getloadavg()}
    compiled = _compiled(codegen)
    found["jvm_cpu_s"] = round(cpu_after[0] - cpu_before[0], 2)
    found["driver_python_cpu_s"] = round(cpu_after[1] - cpu_before[1], 2)
    # Catalyst's rules (analysis and optimisation, every plan of the batch) and Janino's compilations.
    found["rules_s"] = _rule_seconds(rules)
    found["compiled"] = compiled[0] - compiled_before[0]
    found["compile_s"] = round((compiled[1] - compiled_before[1]) / 1e3, 3)
    if os.environ.get("BENCH_STAGES"):
        found["stage_ms"] = _stage_times(spark, sorted(stages))
    if os.environ.get("BENCH_RULES"):
        print(rules.dumpTimeSpent(), file=sys.stderr)
    if os.environ.get("BENCH_DETAIL"):
        names: dict[str, int] = {}
        for job in sorted(jobs):
            info = tracker.getJobInfo(job)
            first = tracker.getStageInfo(max(info.stageIds)) if info and info.stageIds else None
            name = first.name if first else "?"
            names[name] = names.get(name, 0) + 1
        found["by_callsite"] = names
        found["descriptions"] = _job_descriptions(spark, set(jobs))
    return found


def _job_descriptions(spark, jobs: set[int]) -> list[str]:
    """Each job's description as Delta and Spark set it (the status store's, read through py4j)."""
    store = spark._jsc.sc().statusStore()
    listed = store.jobsList(None)
    found = []
    for index in range(listed.size()):
        job = listed.apply(index)
        if job.jobId() in jobs:
            description = job.description()
            text = description.get() if description.isDefined() else job.name()
            found.append((job.jobId(), f"{text[:90]} [{job.numTasks()} tasks]"))
    return [text for _, text in sorted(found)]


def _compiled(codegen) -> tuple[int, float]:
    """Janino compilations so far and their total milliseconds (CodegenMetrics' histogram)."""
    histogram = codegen.METRIC_COMPILATION_TIME()
    snapshot = histogram.getSnapshot()
    return histogram.getCount(), snapshot.getMean() * histogram.getCount()


def _stage_times(spark, stage_ids: list[int]) -> list[dict]:
    """Per stage of the batch: tasks, wall ms from submission to completion, and its tasks' summed run and CPU ms."""
    store = spark.sparkContext._jsc.sc().statusStore()
    found = []
    for stage in stage_ids:
        try:
            data = store.lastStageAttempt(stage)
        except Exception:  # noqa: BLE001 - a skipped stage has no attempt (py4j raises its own error)
            continue
        if data.submissionTime().isEmpty() or data.completionTime().isEmpty():
            continue
        wall = data.completionTime().get().getTime() - data.submissionTime().get().getTime()
        found.append({"stage": stage, "tasks": data.numTasks(), "wall": wall, "run": data.executorRunTime(),
                      "cpu": round(data.executorCpuTime() / 1e6), "name": data.name()[:40]})
    return found


def _rule_seconds(rules) -> float:
    """Seconds Catalyst's rule executors spent since the last reset (from dumpTimeSpent's header)."""
    import re

    found = re.search(r"Total time: ([0-9.]+) seconds", rules.dumpTimeSpent())
    return float(found.group(1)) if found else -1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["jobs", "load"])
    parser.add_argument("--sink", default="warehouse", choices=["warehouse", "analytics", "search", "cache", "changes"])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1_000_000)
    parser.add_argument("--seed-batch", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--tombstones", type=int, default=0,
                        help="load mode: deletes of keys the table does not hold, applied after the seed")
    parser.add_argument("--table", default="orders", choices=list(SHARES), help="load mode: the table used")
    parser.add_argument("--property", action="append", default=[])
    parser.add_argument("--conf", action="append", default=[], help="a Spark SQL setting k=v for the run")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--optimize-every", type=int, default=0,
                        help="after every N batches, compact and vacuum the sink's tables (tide warehouse optimize)")
    args = parser.parse_args()

    from spark_jobs.runtime.session import build_session

    spark = build_session("tideline-bench-delta", ROOT / ".tideline/lib/spark", master=args.master,
                          driver_memory=args.driver_memory)
    spark.sparkContext.setLogLevel("ERROR")
    for item in args.conf:
        spark.conf.set(*item.split("=", 1))
    if os.environ.get("BENCH_CODEGEN_LOG"):  # every generated class's source to stderr (code compiled per batch)
        jvm = spark._jvm
        assert jvm is not None, "a running session has its JVM gateway"
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator", jvm.org.apache.logging.log4j.Level.DEBUG)
    properties = dict(item.split("=", 1) for item in args.property)
    with tempfile.TemporaryDirectory(prefix="tideline-bench-delta-") as warehouse:
        runner = Runner(spark, args.sink, warehouse, properties)
        if args.mode == "jobs":
            # Versions above any earlier run's (100 per second), so a search or cache store kept between
            # runs applies every change instead of ignoring them as older than what it holds.
            run_base = (int(time.time()) - 1_700_000_000) * 100
            # Batch 0 inserts (snapshot), the others update the same keys and insert/delete a few.
            for batch_id in range(args.batches):
                op = "r" if batch_id == 0 else "u"
                tables = ["customers", "products", "orders"] if args.sink == "analytics" else list(SHARES)
                kafka = batch_records(spark, args.rows, op, run_base + batch_id * 10, None, tables).persist()
                kafka.count()
                print(json.dumps(measure(spark, runner, kafka, batch_id, args.rows)), flush=True)
                kafka.unpersist()
                optimize_every(spark, runner.sink, batch_id + 1, args.optimize_every)
        else:
            load(spark, runner, args, properties)
    print_python_workers_cpu()
    spark.stop()


def load(spark, runner: Runner, args, properties: dict[str, str]) -> None:
    """Seed `args.table`, then delete --tombstones keys it does not hold, then update random keys."""
    seeds = [("seed", first + 1, args.seed_batch, "r", 1, None) for first in range(0, args.seed, args.seed_batch)]
    deletes = [("tombstones", args.seed + first + 1, min(args.seed_batch, args.tombstones - first), "d", 2, None)
               for first in range(0, args.tombstones, args.seed_batch)]
    updates = [("update", 1, args.batch, "u", 1000 + step, int(args.seed * 1.05)) for step in range(args.batches)]
    for batch_id, (phase, first_key, count, op, major, keyspace) in enumerate(seeds + deletes + updates):
        kafka = records(spark, args.table, first_key, count, op, major, keyspace=keyspace).persist()
        rows = kafka.count()
        result = measure(spark, runner, kafka, batch_id, rows)
        print(json.dumps({"phase": phase, "table": args.table, "properties": properties, "table_rows": args.seed,
                          "tombstones": args.tombstones, **result}), flush=True)
        kafka.unpersist()
        if phase == "update":
            optimize_every(spark, runner.sink, batch_id - len(seeds) - len(deletes) + 1, args.optimize_every)


if __name__ == "__main__":
    main()
