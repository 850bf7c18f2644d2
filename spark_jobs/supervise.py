"""Supervision of the apply jobs' queries, one per sink (spark_jobs/pipeline.py builds each): start
them, restart one that fails with back-off while the others run, hold the paused ones, re-read
pipeline.yaml's tables when asked, restart a real-time query whose catalogue or task slots changed,
and write the driver's status file every pass."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.model.catalogue import Catalogue, LiveCatalogue
from spark_jobs.model.config import PipelineConfig, PipelineConfigError, load
from spark_jobs.model.files import replace_text
from spark_jobs.model.settings import JobSettings
from spark_jobs.pipeline import build_query, live_catalogue
from spark_jobs.realtime import QueryGroup, WriterTimes, outgrown
from spark_jobs.runtime import checkpoints, control, reload
from spark_jobs.runtime.backoff import Backoff
from spark_jobs.runtime.keep_alive import RESTART

log = logging.getLogger("tideline.pipeline")


@dataclass
class _Supervised:
    query: StreamingQuery | QueryGroup | None = None
    retry_at: float = 0.0
    # A query that ran 30 s was healthy: its next failure restarts quickly again.
    backoff: Backoff = field(default_factory=lambda: Backoff(healthy_after_s=30.0))
    started_at: float = 0.0
    last_error: str | None = None
    logged_batch: int = -1
    paused: bool = False
    # The catalogue a real-time query was planned with (its plan keeps it until the query restarts).
    catalogue: Catalogue | None = None


def _log_progress(sink: str, state: _Supervised) -> None:
    """One line per finished micro-batch: rows, duration and where the time went."""
    progress = state.query.lastProgress if state.query else None
    if progress and progress["batchId"] != state.logged_batch:
        state.logged_batch = progress["batchId"]
        log.info("%s", progress_line(sink, progress))


def progress_line(sink: str, progress: dict) -> str:
    """`<sink> batch N: R rows in T ms (add batch A ms; ...)`: the trigger's whole time, the time in the
    foreachBatch function (the sink's work) and each of the streaming engine's own steps (Kafka's end
    offsets, the offset log, planning, the commit log), which a small batch can spend as long in."""
    durations = progress.get("durationMs") or {}
    steps = "".join(f"; {name} {ms}" for name, ms in sorted(durations.items())
                    if name not in ("triggerExecution", "addBatch"))
    return (f"{sink} batch {progress['batchId']}: {progress.get('numInputRows')} rows in "
            f"{durations.get('triggerExecution')} ms (add batch {durations.get('addBatch')} ms{steps})")


@dataclass
class _Reloads:
    """The last request to re-read pipeline.yaml the driver handled, and why it was refused, if it was."""

    handled: str | None
    error: str | None = None


def _reload(settings: JobSettings, pipeline: PipelineConfig,
            supervised: dict[str, _Supervised]) -> PipelineConfig:
    """Re-read pipeline.yaml's tables: stop each query whose tables changed, set its checkpoint aside
    if a table left it, and let the loop start it again on its new topics. The others run on.
    Raises PipelineConfigError (nothing changed) if the new file cannot replace the old one."""
    new = load(settings.pipeline_file)
    if problem := reload.refusal(pipeline, new):
        raise PipelineConfigError(problem)
    for sink, change in reload.changes(pipeline, new, list(settings.sinks)).items():
        log.warning("query %s: tables %s -> %s", sink, sorted(change.before), sorted(change.after))
        state = supervised.pop(sink, None)
        if state is not None and state.query is not None and state.query.isActive:
            state.query.stop()
        if change.removed:
            checkpoints.retire(settings.checkpoint_dir / sink)
        if change.after:
            supervised[sink] = _Supervised(paused=state.paused if state else False)
    return new


def supervise(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig) -> None:
    """Run every configured sink's query; restart one that fails (e.g. its store is down) with
    exponential back-off while the others keep running; re-read pipeline.yaml's tables when asked
    (`tide tables add | remove`). Returns only if the session stops."""
    # By sink name (a reload adds and removes them; each is looked up in the registry when started).
    supervised: dict[str, _Supervised] = {sink: _Supervised() for sink in settings.sinks if pipeline.sink_tables(sink)}
    catalogue = live_catalogue(settings, pipeline)
    # A request written before this driver started is already in the pipeline it loaded.
    reloads = _Reloads(control.read_reload(settings.reload_file))
    writer_times = WriterTimes(spark, settings)
    while True:
        now = time.monotonic()
        writer_times.log_due(now)
        if (request := control.read_reload(settings.reload_file)) != reloads.handled:
            try:
                pipeline, reloads.error = _reload(settings, pipeline, supervised), None
                catalogue = live_catalogue(settings, pipeline)
                _restart_if_outgrown(spark, settings, pipeline, supervised)
            except PipelineConfigError as exc:
                reloads.error = str(exc)
                log.error("pipeline.yaml not re-read: %s", exc)
            reloads.handled = request
        paused = control.read_paused(settings.paused_file)
        due: list[str] = []
        for sink, state in supervised.items():
            if _hold_paused(sink, state, sink in paused):
                continue
            if state.query is not None and state.query.isActive:
                checkpoints.drop_retired(settings.checkpoint_dir / sink)
                _log_progress(sink, state)
                if sink in settings.realtime_sinks:
                    _restart_on_new_catalogue(sink, state, catalogue.current(), pipeline.sink_tables(sink))
                continue
            if state.query is not None:
                state.last_error = str(state.query.exception() or "stopped")[:500]
                state.query.stop()  # a query group's other query may still run: its name must be free again
                wait = state.backoff.after(now - state.started_at)
                log.error("query %s stopped: %s; restarting in %.0fs", sink, state.last_error, wait)
                state.query, state.retry_at = None, now + wait
            elif now >= state.retry_at:
                due.append(sink)
        _start_all(spark, settings, pipeline, {sink: supervised[sink] for sink in due}, catalogue)
        write_status(settings, supervised, pipeline, reloads)
        # A query failed: the next pass records its error and restarts it with backoff.
        with contextlib.suppress(StreamingQueryException):
            spark.streams.awaitAnyTermination(timeout=5)
        spark.streams.resetTerminated()


def _start_all(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig,
               due: dict[str, _Supervised], catalogue: LiveCatalogue) -> None:
    """Start the `due` queries at once, one thread each: a query's start is mostly waiting (on the
    stores' set-up requests, on the Delta log's reads, on Spark jobs of one task), so they overlap
    on 2 cores; measured at a driver start: 24 s one after the other. Real-time queries start one
    at a time among themselves, as each counts the task slots the others already hold."""
    if not due:
        return
    realtime_lock = threading.Lock()

    def start_one(sink: str, state: _Supervised) -> None:
        began = time.monotonic()
        try:
            if sink in settings.realtime_sinks:
                with realtime_lock:
                    state.catalogue = catalogue.current()
                    state.query = build_query(spark, settings, pipeline, sink)
            else:
                state.catalogue, state.query = None, build_query(spark, settings, pipeline, sink)
            state.started_at = began
            log.info("query %s started in %.1f s", sink, time.monotonic() - began)
        except Exception as exc:  # noqa: BLE001 - e.g. the store is down during setup: retry later
            state.last_error = str(exc)[:500]
            wait = state.backoff.after()
            log.error("cannot start query %s: %s; retrying in %.0fs", sink, exc, wait)
            state.retry_at = time.monotonic() + wait

    with ThreadPoolExecutor(max_workers=len(due), thread_name_prefix="query-start") as pool:
        for future in [pool.submit(start_one, sink, state) for sink, state in due.items()]:
            future.result()


def _restart_if_outgrown(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig,
                         supervised: dict[str, _Supervised]) -> None:
    """End the driver, asking the keep-alive to start it again, when the reloaded `pipeline` gives the
    real-time queries more partitions than the session has task slots: a local session's slots are
    fixed when it starts (`realtime.local_master`), and a query with fewer would be refused. The
    restarted driver starts every query with the new tables (the reload is already done: stopped
    queries, retired checkpoints)."""
    master = spark.sparkContext.master
    if (wanted := outgrown(master, settings, pipeline)) is None:
        return
    log.warning("pipeline.yaml's real-time queries need %s, this session has %s: the driver stops, to be "
                "started again with them", wanted, master)
    for state in supervised.values():
        if state.query is not None and state.query.isActive:
            state.query.stop()
    spark.stop()
    sys.exit(RESTART)


def _restart_on_new_catalogue(sink: str, state: _Supervised, catalogue: Catalogue,
                              tables: list[str]) -> None:
    """Stop a real-time query whose tables' columns changed at the source (the loop starts it again at
    once, planned with the new catalogue): its decoder's time columns and the cache's column types
    were fixed when it was planned. The epoch in flight is replayed."""
    if state.query is None or state.catalogue is None or not columns_changed(state.catalogue, catalogue, tables):
        return
    log.warning("query %s: the source's columns changed; restarting it with the new catalogue", sink)
    state.query.stop()
    state.query, state.retry_at = None, 0.0


def columns_changed(planned: Catalogue, current: Catalogue, tables: list[str]) -> bool:
    """Whether any of `tables` has other columns (or types) in `current` than in `planned`."""
    return any(current.get(table) != planned.get(table) for table in tables)


def _hold_paused(sink: str, state: _Supervised, paused: bool) -> bool:
    """Stop a query the operator paused (`tide jobs pause`) and keep it stopped; True while paused.
    Stopping between or during a batch is safe: its offsets are not committed, so it is replayed."""
    if paused and not state.paused:
        log.warning("query %s paused by the operator", sink)
        if state.query is not None and state.query.isActive:
            state.query.stop()
        state.query = None
    elif state.paused and not paused:
        log.warning("query %s resumed by the operator", sink)
        state.retry_at = 0.0
        state.backoff.reset()
    state.paused = paused
    return paused


# A query that refuses its plan or subscription stops within a second or two of its first batch's start
# (the loop would see it stopped sooner: a termination ends its wait at once).
RUNNING_AFTER_S = 5.0


def _running(state: _Supervised) -> bool:
    """Whether the query has made progress, or has been in a batch (a real-time query's first epoch,
    which reports progress only at its end) for RUNNING_AFTER_S: its plan and subscription were taken."""
    query = state.query
    if query is None or not query.isActive:
        return False
    if query.lastProgress is not None:
        return True
    return bool(query.status.get("isTriggerActive")) and time.monotonic() - state.started_at >= RUNNING_AFTER_S


def _batch_id(state: _Supervised) -> int | None:
    """The query's last finished micro-batch (epoch), None before its first."""
    progress = state.query.lastProgress if state.query else None
    return progress.get("batchId") if progress else None


def write_status(settings: JobSettings, supervised: dict[str, _Supervised], pipeline: PipelineConfig,
                 reloads: _Reloads) -> None:
    """Each query's state and tables for `tide jobs status` and `tide tables` (written atomically:
    write then rename), and the last reload request handled."""
    status = {
        "written_at_ms": int(time.time() * 1000),
        "queries": {
            sink: {
                "active": bool(state.query is not None and state.query.isActive),
                "paused": state.paused,
                "last_error": state.last_error,
                "batch_id": _batch_id(state),
                "running": _running(state),
                "tables": pipeline.sink_tables(sink),
            }
            for sink, state in supervised.items()
        },
        "reload": {"request": reloads.handled, "error": reloads.error},
    }
    replace_text(settings.status_file, json.dumps(status))
