"""Rebuild one sink from the compacted change topics, without touching PostgreSQL.

- search: every alias gets a new index version, filled by a query of its own
  (fresh checkpoint: offset zero, run until caught up), then the aliases swap
  atomically and a second pass catches up with what arrived meanwhile. The live
  query writes through the alias, so after the swap it feeds the new version;
  searches never see a half-built index. Old versions are kept for roll-back.
- cache / warehouse / analytics: the jobs stop, the sink's store and checkpoint are
  cleared, and the jobs start again, so that sink's query replays from offset zero. The
  warehouse's current-state tables and its derived tables (analytics: history, windows) are
  separate folders of the same warehouse, each cleared only by its own rebuild.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import redis

from services.jobs import driver
from services.settings import StackSettings
from services.stack import process, runner
from spark_jobs import checkpoints
from spark_jobs.config import PipelineConfig, load
from spark_jobs.settings import JobSettings

Report = Callable[[str], None]


def rebuild_search(settings: StackSettings, report: Report) -> dict[str, str]:
    """New index versions behind the aliases; returns {alias: new index}."""
    from spark_jobs.pipeline import live_catalogue  # pyspark: only a rebuild runs Spark in this process
    from spark_jobs.session import build_session
    from spark_jobs.sinks.elasticsearch import ElasticsearchSink

    jobs = driver.job_settings(settings)
    pipeline = load(jobs.pipeline_file)
    live = ElasticsearchSink(jobs.elasticsearch_url, pipeline, jobs.es_bulk_size)
    live.setup(None, live_catalogue(jobs, pipeline).current())
    targets = {table: live.create_version(live.alias(table)) for table in pipeline.sink_tables("search")}
    nested = {name: live.create_version(name) for name in pipeline.nested}
    report(f"building {', '.join([*targets.values(), *nested.values()])}")
    fresh = ElasticsearchSink(jobs.elasticsearch_url, pipeline, jobs.es_bulk_size, targets=targets,
                              nested_targets=nested)
    checkpoint = jobs.checkpoint_dir / f"search-rebuild-{int(time.time())}"
    spark = build_session("tideline-rebuild", jobs.jars_dir, master=jobs.master, driver_memory=jobs.driver_memory)
    try:
        _catch_up(spark, jobs, pipeline, fresh, checkpoint)
        for alias, index in [*((live.alias(t), i) for t, i in targets.items()), *nested.items()]:
            live.swap_alias(alias, index)
        report("aliases swapped; catching up with changes since the build")
        _catch_up(spark, jobs, pipeline, fresh, checkpoint)
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return {**{live.alias(table): index for table, index in targets.items()}, **nested}


def _catch_up(spark, jobs: JobSettings, pipeline: PipelineConfig, sink, checkpoint: Path) -> None:
    from spark_jobs.pipeline import build_query

    query = build_query(spark, jobs, pipeline, "search", sink=sink, checkpoint=checkpoint, available_now=True)
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"rebuild query failed: {query.exception()}")


def rebuild_by_replay(settings: StackSettings, sink: str, report: Report) -> None:
    """Clear one sink's store and checkpoint and let its query replay from offset zero."""
    jobs = driver.job_settings(settings)
    was_running = process.stop(runner.pid_file(settings, driver.SERVICE))
    if sink == "cache":
        redis.Redis.from_url(jobs.redis_url).flushdb()
    else:
        from spark_jobs.pipeline import make_sink

        for folder in make_sink(sink, jobs, load(jobs.pipeline_file)).folders():
            shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(jobs.checkpoint_dir / sink, ignore_errors=True)
    shutil.rmtree(checkpoints.retired(jobs.checkpoint_dir / sink), ignore_errors=True)  # else it would resume there
    report(f"{sink} cleared; replaying from offset zero")
    if was_running:
        runner.start_and_wait(settings, [driver.SERVICE])
