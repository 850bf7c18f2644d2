"""Entry point: `python -m spark_jobs --keep-alive` locally (via `tide jobs start`: the driver in a child
process, started again if it dies; spark_jobs/keep_alive.py) or `spark-submit --master <url> ...
spark_jobs/__main__.py` on a cluster. Settings come from TIDE_JOB_*."""

from __future__ import annotations

import logging
import sys

from spark_jobs import keep_alive
from spark_jobs.catalogue import CatalogueError
from spark_jobs.config import PipelineConfigError, check_schema, load
from spark_jobs.pipeline import live_catalogue, supervise
from spark_jobs.session import build_session
from spark_jobs.settings import JobSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("elastic_transport").setLevel(logging.WARNING)  # a line per request: the driver's own log is per batch
    settings = JobSettings()
    try:
        pipeline = load(settings.pipeline_file)
        # The views' columns against the source's catalogue, before any query starts.
        check_schema(pipeline, live_catalogue(settings, pipeline).current(), settings.pipeline_file)
    except (PipelineConfigError, CatalogueError, ValueError) as exc:
        print(exc, file=sys.stderr)  # one line, the last of the log `tide jobs start` quotes
        sys.exit(keep_alive.CONFIG_REFUSED)
    spark = build_session("tideline-apply", settings.jars_dir, master=settings.master, driver_memory=settings.driver_memory)
    jvm = keep_alive.launched_jvm(spark)
    keep_alive.exit_with_the_jvm(jvm)
    keep_alive.run_until_the_jvm_ends(jvm, lambda: supervise(spark, settings, pipeline))


if __name__ == "__main__":
    if "--keep-alive" in sys.argv[1:]:
        keep_alive.main()
    else:
        main()
