"""Build the SparkSession every Tideline job uses: Kafka source and Delta Lake, offline.

The Kafka source and Delta jars are resolved ahead of time by Maven
(spark_jobs/jars/pom.xml, `tide stack fetch`), so a session never downloads
anything at start. Nothing here runs at import time.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.runtime import class_archive, code_archive

# The scheduler pools' weights and minimum shares, one pool per sink's query.
POOLS = Path(__file__).with_name("pools.xml")
# Generated classes kept compiled (Spark's default is 100); a few tens of KB of bytecode each.
CODEGEN_CACHE_ENTRIES = 2000
# Spark 4.2 moved it into the package `checkpointing` (4.0: org.apache.spark.sql.execution.streaming).
_CHECKPOINT_FILES = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


# What a real-time query runs with instead: planned once and run for hours, its rows are what costs, and
# generated code pays off (the cache's drain of 241,301 records: 42.0 s interpreted, 38.1 s compiled).
GENERATED_CODE = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
_STARTS = threading.Lock()


@contextmanager
def starting_with(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """Start a streaming query with `conf` in its SQL conf. A query takes a copy of its session's conf
    when it starts, so `conf` is set on the shared session for the start alone, under a lock that
    every query's start holds (the queries start in threads of their own: spark_jobs/pipeline.py)."""
    with _STARTS:
        held = {key: spark.conf.get(key, None) for key in conf}
        for key, value in conf.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key, before in held.items():
                if before is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, before)


def jar_files(jar_dir: Path) -> list[str]:
    jars = sorted(str(path) for path in jar_dir.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(f"no jars in {jar_dir}: run `tide stack fetch` to resolve the Spark jars")
    return jars


def build_session(
    app_name: str,
    jar_dir: Path,
    *,
    master: str | None = "local[2]",
    driver_memory: str = "1g",
    shuffle_partitions: int = 2,
    jvm_options: list[str] | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session with the Kafka source and Delta Lake on the classpath.

    master=None leaves the master to spark-submit (`--master spark://...`), so the
    same job runs unchanged on a cluster. A local driver's JVM maps the class archive when `tide stack
    fetch` wrote one (class_archive.py), then takes `jvm_options` (TIDE_JOB_JVM_OPTIONS); a cluster's
    executors take them too, and the package's code (code_archive.py). `conf`: more settings (a cluster's
    share: realtime.cluster_conf).
    """
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.jars", ",".join(jar_files(jar_dir)))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        # Without adaptive execution a micro-batch is one Spark job (each shuffle is a stage of it, not a
        # job of its own): measured 1 job instead of 3 for the cache, 2 instead of 8 for search (docs/apply.md).
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.default.parallelism", str(shuffle_partitions))
        # Delta reads its log with 50 tasks by default: pure overhead on small local tables.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # progress bars would fill the driver's log
        # Each sink's query runs in its own scheduler pool: a heavy Delta MERGE must not queue
        # the cache's tasks behind it (FIFO would), so a slow sink never holds back the others.
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(POOLS))
        .config("spark.sql.session.timeZone", "UTC")
        # Generated code is cached by its text, 100 classes by default. With code generation on (below
        # it is off, so this only matters if someone turns it back on) a warehouse batch generated about
        # 200 classes and an analytics batch about 500: they evicted each other and every batch compiled
        # them all again, 211 and 528 compilations, 0 and 2 with this cache (docs/apply.md).
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        # Plans run interpreted, not compiled (real-time queries excepted: GENERATED_CODE): a micro-batch's
        # cost is its jobs' planning, not its rows, and generated classes were compiled again after
        # every start and for every new key range a MERGE inlines. Interpreted, batches of 200 to 100,000
        # changes took as long or less, the Delta queries' 7-18 % less (docs/apply.md, "Generated code, or none").
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    )
    if master:
        builder = builder.master(master)
        # A JVM out of heap ends at once (the keep-alive starts the driver again: spark_jobs/runtime/keep_alive.py;
        # a cluster's worker an executor) rather than limping on with threads that died of the error.
        on_heap_exhausted = ["-XX:+ExitOnOutOfMemoryError", *(jvm_options or [])]
        builder = builder.config("spark.driver.extraJavaOptions",
                                 " ".join([*class_archive.reading(jar_dir), *on_heap_exhausted]))
        if master.startswith("local"):
            # Driver and executors share this process: its RPC and block-manager ports need not leave
            # loopback (Spark binds every interface by default). A cluster run sets these itself.
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
            # Python workers import pyspark from the installed package, not Spark's zip archives, which
            # cost every task ~90 ms (spark_jobs/runtime/worker_daemon.py).
            builder = builder.config("spark.python.daemon.module", "spark_jobs.runtime.worker_daemon")
            # Checkpoints on the local disk through Hadoop's FileSystem API, not its FileContext API. Without
            # Hadoop's native library FileContext asks `readlink`, a process forked per call, whether each
            # path is a symbolic link: a bare query forked 17 processes a second and spent 35 ms writing its
            # offset log and 33 ms its commit log per batch; with this, 4 forks (the `chmod`s) and 11 ms,
            # 10 ms (docs/apply.md, "Fixed cost per batch"). Spark uses this manager itself wherever
            # FileContext is missing; on a local disk its rename is the POSIX one, atomic.
            builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_FILES)
        else:
            builder = builder.config("spark.executor.extraJavaOptions", " ".join(on_heap_exhausted))
        # Local Python workers run this interpreter (the project's environment), not whatever
        # `python3` is first on PATH. On a cluster, PYSPARK_PYTHON names the workers' interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if master and not master.startswith("local"):
        spark.sparkContext.addPyFile(str(code_archive.for_this_driver()))
    return spark
