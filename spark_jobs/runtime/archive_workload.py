"""The workload whose classes the driver's class archive holds (spark_jobs/runtime/class_archive.py):
`python -m spark_jobs.runtime.archive_workload JAR_DIR WORK_DIR` runs, in small, what a driver does (a
session, Delta writes and MERGEs, a streaming query's batches) in a JVM that writes its archive to
WORK_DIR as it exits."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from spark_jobs.runtime import class_archive
from spark_jobs.runtime.session import build_session

_STREAM_BATCHES = 3
_DEADLINE_S = 150


def _exercise(jar_dir: Path, work: Path) -> None:
    """What a driver does, in small: the classes it loads are what the archive holds."""
    from delta.tables import DeltaTable

    # No archive to map yet (class_archive.make runs this only then), so the session's options only write one.
    spark = build_session("tideline-class-archive", jar_dir, master="local[2]",
                          jvm_options=class_archive.writing(work / class_archive.ARCHIVE))
    table = str(work / "table")
    spark.range(0, 1000).selectExpr("id", "id AS version", "CAST(id AS STRING) AS name") \
        .write.format("delta").save(table)

    def merge(batch, _batch_id: int = 0) -> None:
        (DeltaTable.forPath(spark, table).alias("t")
         .merge(batch.selectExpr("value % 1500 AS id", "value AS version", "CAST(value AS STRING) AS name")
                .alias("b"), "t.id = b.id")
         .whenMatchedUpdateAll("b.version > t.version").whenNotMatchedInsertAll().execute())

    merge(spark.range(0, 500).withColumnRenamed("id", "value"))
    spark.read.format("delta").load(table).where("version > 10").count()
    # A streaming query of a few batches that ends by itself (availableNow over files, one a batch).
    feed = work / "feed"
    for part in range(_STREAM_BATCHES):
        spark.range(part * 200, part * 200 + 200).withColumnRenamed("id", "value").write.mode("append").json(str(feed))
    query = (spark.readStream.schema("value LONG").option("maxFilesPerTrigger", 1).json(str(feed))
             .writeStream.foreachBatch(merge).option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(_DEADLINE_S)
    _exit_and_wait(spark)


def _exit_and_wait(spark) -> None:
    """End the JVM the way that writes its archive (System.exit), and wait until it has."""
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    with contextlib.suppress(Exception):  # the gateway's connection ends with the JVM
        spark.sparkContext._jvm.java.lang.System.exit(0)
    deadline = time.monotonic() + 120
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.5)  # poll: the JVM writes the archive before it ends


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


if __name__ == "__main__":
    _exercise(Path(sys.argv[1]), Path(sys.argv[2]))
