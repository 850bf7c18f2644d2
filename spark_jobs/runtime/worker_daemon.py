"""The local Python workers' daemon: pyspark's own, started with pyspark imported from the installed
package instead of the zip archives Spark puts first on the workers' path.

Why: before every task, pyspark's worker calls `importlib.invalidate_caches()`, and Python 3.11's
zip importer then reads its whole archive's directory again, once per package imported from it. With
pyspark imported from `pyspark.zip` (1,220 files), and Spark's core jar on the path too (a jar is a
zip: thousands of classes), that was 16 importers and about 90 ms of a core per task on this machine
(docs/apply.md, "Fixed cost per batch"); search and cache run several Python tasks per micro-batch.
Spark starts this module (`spark.python.daemon.module`, set by `session.build_session` for local
masters only: on a cluster the executors' interpreter may have pyspark only as those archives).
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys

# What Spark adds (PythonUtils.sparkPythonPath): SPARK_HOME/python/lib's archives and its own jar.
_SPARK_ARCHIVE = re.compile(r"^(pyspark\.zip|py4j-[0-9.]+-src\.zip|.*\.jar)$")


def without_spark_archives(path: list[str]) -> list[str]:
    """`path` without the archives of pyspark and py4j and the jars that Spark puts on the workers' path."""
    return [entry for entry in path if not _SPARK_ARCHIVE.match(os.path.basename(entry))]


def main() -> None:
    kept = without_spark_archives(sys.path)
    if kept != sys.path:
        found_before = sys.path[:]
        sys.path[:] = kept
        if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("py4j") is None:
            sys.path[:] = found_before  # pyspark exists only as the archives here: keep them
        else:
            # The importers already made for the archives (importing this module probed them).
            dropped = tuple(set(found_before) - set(kept))
            for entry in [key for key in sys.path_importer_cache if key.startswith(dropped)]:
                del sys.path_importer_cache[entry]
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
