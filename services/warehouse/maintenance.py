"""`tide warehouse optimize`: compact and vacuum the Delta sinks' tables while their queries are paused.

The driver keeps running: only the Delta queries asked for are paused (the paused file of `tide jobs
pause`) while the maintenance runs, and resumed after, so search and cache stay fresh meanwhile. A
query the operator had paused before stays paused. The work runs in a Spark session of this process,
as `tide rebuild` does; docs/sinks/delta.md, "Maintenance", says what it does to readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from services.jobs import driver
from services.settings import StackSettings
from services.stack.service import StackError
from spark_jobs.model.config import load
from spark_jobs.model.sink_registry import DELTA_SINKS
from spark_jobs.runtime import control
from spark_jobs.sinks.base import build_sink
from spark_jobs.sinks.delta.maintenance import (
    DEFAULT_RETAIN_HOURS,
    Maintained,
    delta_tables,
    maintain,
    session_settings,
)

Report = Callable[[str], None]
# A paused query stops at the driver's next supervision round (a second or two; a MERGE in flight is
# cancelled and replayed later), unless the driver is busy starting.
PAUSE_DEADLINE_S = 120.0


def check_sinks(names: list[str] | None) -> list[str]:
    """The Delta sinks to maintain: those named, or all of them."""
    unknown = [name for name in names or [] if name not in DELTA_SINKS]
    if unknown:
        raise StackError(f"{', '.join(unknown)}: not a Delta sink; `tide warehouse optimize --sink` takes "
                         f"{' or '.join(DELTA_SINKS)}")
    return list(dict.fromkeys(names)) if names else list(DELTA_SINKS)


def check_retention(hours: float) -> None:
    if hours < 0:
        raise StackError(f"--retain-hours {hours:g}: a retention cannot be negative (Delta's default: "
                         f"{DEFAULT_RETAIN_HOURS:g})")


def optimize(settings: StackSettings, sinks: list[str], retain_hours: float, report: Report) -> list[Maintained]:
    """Compact and vacuum every Delta table of `sinks`, their queries paused meanwhile."""
    from spark_jobs.runtime.session import build_session  # pyspark: only maintenance runs Spark here

    jobs = driver.job_settings(settings)
    pipeline = load(jobs.pipeline_file)
    tables = [path for sink in sinks for path in delta_tables(build_sink(sink, jobs, pipeline).folders())]
    if not tables:
        report("no Delta tables yet: nothing to optimize")
        return []
    with paused(settings, sinks, report):
        spark = build_session("tideline-maintenance", jobs.jars_dir, master=jobs.master,
                              driver_memory=jobs.driver_memory)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            for key, value in session_settings(spark, retain_hours).items():
                spark.conf.set(key, value)
            done = []
            for path in tables:
                done.append(maintain(spark, path, retain_hours))
                report(describe(done[-1], settings.state_dir))
            return done
        finally:
            spark.stop()


def describe(done: Maintained, state_dir: Path) -> str:
    """One table's line: its files read by the current version and on disk, before -> after."""
    name = done.path.removeprefix(str(state_dir)).lstrip("/")
    on_disk = "" if done.on_disk_before is None else f", on disk {done.on_disk_before} -> {done.on_disk_after}"
    return f"{name}: files read {done.files_before} -> {done.files_after}{on_disk}"


@contextmanager
def paused(settings: StackSettings, sinks: list[str], report: Report,
           deadline_s: float = PAUSE_DEADLINE_S) -> Iterator[None]:
    """Pause the queries of `sinks` that run, until the block ends; those already paused are left so."""
    path = driver.paused_file(settings)
    held = control.read_paused(path)
    ours = set(sinks) - held
    if ours:
        control.write_paused(path, held | ours)
        report(f"pausing {', '.join(sorted(ours))}")
    try:
        deadline = time.monotonic() + deadline_s
        while not stopped(driver.read_status(settings), ours, time.time()):
            if time.monotonic() > deadline:
                raise StackError(f"the {', '.join(sorted(ours))} queries did not stop within {deadline_s:.0f} s "
                                 "of being paused: see `tide jobs status`; nothing was compacted")
            time.sleep(0.5)
        yield
    finally:
        if ours:
            # Read again: the operator may have paused another sink meanwhile.
            control.write_paused(path, control.read_paused(path) - ours)
            report(f"resumed {', '.join(sorted(ours))}")


def stopped(status: dict | None, sinks: set[str], now_s: float) -> bool:
    """Whether no query of `sinks` runs, by the drivers' merged report (driver.read_status). A query whose
    driver has not reported for driver.STATUS_STALE_S runs nowhere: that driver is down."""
    for sink in sinks:
        query = (status or {}).get("queries", {}).get(sink)
        if query is None or now_s - query["reported_at_ms"] / 1000 > driver.STATUS_STALE_S:
            continue
        if query["active"] or not query.get("paused"):
            return False
    return True


__all__ = ["check_retention", "check_sinks", "describe", "optimize", "paused", "stopped"]
