"""The local Python workers import pyspark from the installed package (spark_jobs/runtime/worker_daemon.py)."""

from __future__ import annotations

from typing import Any

from spark_jobs.runtime.worker_daemon import without_spark_archives


def test_the_archives_spark_adds_are_left_out_and_nothing_else() -> None:
    path = ["/work/app", "/spark/python/lib/pyspark.zip", "/spark/python/lib/py4j-0.10.9.9-src.zip",
            "/venv/site-packages/pyspark/jars/spark-core_2.13-4.0.4.jar", "/usr/lib/python311.zip",
            "/venv/site-packages", "/work/app/vendor.zip"]
    assert without_spark_archives(path) == ["/work/app", "/usr/lib/python311.zip", "/venv/site-packages",
                                            "/work/app/vendor.zip"]


def _worker_imports(batches: Any) -> Any:
    """Runs in a Python worker: where pyspark came from, and the zip importers its tasks re-read."""
    import sys
    import zipimport

    import pyarrow as pa
    import pyspark

    for _ in batches:
        pass
    zips = [path for path, finder in sys.path_importer_cache.items() if isinstance(finder, zipimport.zipimporter)]
    yield pa.RecordBatch.from_pylist([{"pyspark": pyspark.__file__, "zips": zips}])


def test_a_python_task_imports_pyspark_from_the_package_with_no_zip_importer(spark: Any) -> None:
    found = spark.range(1).mapInArrow(_worker_imports, "pyspark string, zips array<string>").collect()[0]
    assert ".zip" not in found.pyspark
    assert found.zips == []
