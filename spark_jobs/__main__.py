"""Entry point: `python -m spark_jobs --keep-alive` locally (via `tide jobs start`: the drivers in child
processes, each started again if it dies; spark_jobs/runtime/keep_alive.py, spark_jobs/runtime/drivers.py) or
`spark-submit --master <url> ... spark_jobs/__main__.py` on a cluster. Settings come from TIDE_JOB_*."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TypeVar

from spark_jobs.model.config import PipelineConfig, check_schema, load
from spark_jobs.model.errors import TidelineError
from spark_jobs.model.settings import JobSettings, read_settings
from spark_jobs.pipeline import live_catalogue
from spark_jobs.realtime import cluster_conf, local_master
from spark_jobs.runtime import drivers, keep_alive
from spark_jobs.runtime.session import build_session
from spark_jobs.supervise import supervise

T = TypeVar("T")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # a line per request: the driver's own log is per batch
    logging.getLogger("elastic_transport").setLevel(logging.WARNING)
    settings = _or_refused(read_settings)
    pipeline = _or_refused(lambda: _checked_pipeline(settings))
    spark = build_session("tideline-apply", settings.jars_dir, master=local_master(settings, pipeline),
                          driver_memory=settings.driver_memory, jvm_options=settings.jvm_options.split(),
                          conf=cluster_conf(settings, pipeline))
    jvm = keep_alive.launched_jvm(spark)
    keep_alive.exit_with_the_jvm(jvm)
    keep_alive.run_until_the_jvm_ends(jvm, lambda: supervise(spark, settings, pipeline))


def _checked_pipeline(settings: JobSettings) -> PipelineConfig:
    pipeline = load(settings.pipeline_file)
    # The views' columns against the source's catalogue, before any query starts.
    check_schema(pipeline, live_catalogue(settings, pipeline).current(), settings.pipeline_file)
    return pipeline


def _or_refused(read: Callable[[], T]) -> T:
    """What `read` returns; a refused configuration ends the process with one line, and is not retried."""
    try:
        return read()
    except TidelineError as exc:  # docs/errors.md: one line naming the problem and the fix
        print(exc, file=sys.stderr)  # one line, the last of the log `tide jobs start` quotes
        sys.exit(keep_alive.CONFIG_REFUSED)


if __name__ == "__main__":
    if "--keep-alive" in sys.argv[1:]:
        keep_alive.main(drivers.children(_or_refused(read_settings), [sys.executable, "-m", "spark_jobs"]))
    else:
        main()
