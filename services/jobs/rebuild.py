"""Rebuild one sink from the compacted change topics, without touching PostgreSQL. How is the sink's
to say (its capabilities in spark_jobs/model/sink_registry.py):

- SWAPS_ON_REBUILD (search): the sink builds a target over new physical stores (every alias gets a
  new index version), filled by a query of its own (fresh checkpoint: offset zero, run until caught
  up); then it promotes the target (the aliases swap atomically) and a second pass catches up with
  what arrived meanwhile. The live query writes through the alias, so after the swap it feeds the
  new version; searches never see a half-built index. Old versions are kept for roll-back.
- CLEARS (cache, warehouse, analytics): the jobs stop, the sink clears what it wrote (the cache only
  its own keys; the warehouse's current-state tables and its derived tables are separate folders,
  each cleared only by its own rebuild) and its checkpoint goes, and the jobs start again, so that
  sink's query replays from offset zero.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from services.jobs import driver
from services.settings import StackSettings
from services.stack import process, runner
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig, load
from spark_jobs.model.settings import JobSettings
from spark_jobs.model.sink_registry import Capability
from spark_jobs.runtime import checkpoints
from spark_jobs.sinks.base import Sink, build_sink

Report = Callable[[str], None]


def rebuild(settings: StackSettings, name: str, report: Report) -> dict[str, str]:
    """Rebuild the sink called `name` the way it can; returns {name users read: new store} when it
    swapped stores in, else {}."""
    from spark_jobs.model.sink_registry import spec_of

    capabilities = spec_of(name).capabilities
    if Capability.SWAPS_ON_REBUILD in capabilities:
        return _rebuild_by_swap(settings, name, report)
    if Capability.CLEARS in capabilities:
        _rebuild_by_replay(settings, name, report)
        return {}
    raise StackError(f"{name} can neither be cleared nor rebuilt into new stores")


def _rebuild_by_swap(settings: StackSettings, name: str, report: Report) -> dict[str, str]:
    from spark_jobs.pipeline import live_catalogue  # pyspark: only a rebuild runs Spark in this process
    from spark_jobs.runtime.session import build_session

    jobs = driver.job_settings(settings)
    pipeline = load(jobs.pipeline_file)
    live = build_sink(name, jobs, pipeline)
    # No session yet: a SWAPS_ON_REBUILD sink (search) sets up without Spark, its setup takes None; the
    # capability is known at run time only, and Sink.setup types the session for every sink.
    live.setup(None, live_catalogue(jobs, pipeline).current())  # type: ignore[arg-type]
    target = live.rebuild_target()
    report(f"building {name} into new stores")
    checkpoint = jobs.checkpoint_dir / f"{name}-rebuild-{int(time.time())}"
    spark = build_session("tideline-rebuild", jobs.jars_dir, master=jobs.master, driver_memory=jobs.driver_memory)
    try:
        _catch_up(spark, jobs, pipeline, name, target, checkpoint)
        swapped = live.promote(target)
        report("swapped in; catching up with changes since the build")
        _catch_up(spark, jobs, pipeline, name, target, checkpoint)
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return swapped


def _catch_up(spark, jobs: JobSettings, pipeline: PipelineConfig, name: str, sink: Sink, checkpoint: Path) -> None:
    from spark_jobs.pipeline import build_query

    query = build_query(spark, jobs, pipeline, name, sink=sink, checkpoint=checkpoint, available_now=True)
    query.awaitTermination()  # raises the query's own exception if it failed


def _rebuild_by_replay(settings: StackSettings, name: str, report: Report) -> None:
    """Clear one sink's store and checkpoint and let its query replay from offset zero."""
    jobs = driver.job_settings(settings)
    was_running = process.stop(runner.pid_file(settings, driver.SERVICE))
    build_sink(name, jobs, load(jobs.pipeline_file)).clear()
    shutil.rmtree(jobs.checkpoint_dir / name, ignore_errors=True)
    shutil.rmtree(checkpoints.retired(jobs.checkpoint_dir / name), ignore_errors=True)  # else it would resume there
    report(f"{name} cleared; replaying from offset zero")
    if was_running:
        runner.start_and_wait(settings, [driver.SERVICE])
