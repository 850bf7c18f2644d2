"""Which local driver process runs which queries, and at what CPU priority.

On a machine this small the four queries compete for the same cores, and within one JVM nothing can
put the Delta queries' planning, code generation and tasks behind a search or cache batch: the FAIR
pools only order tasks, never the driver's own threads. So, when `TIDE_JOB_DELTA_DRIVER_NICE` is
set, the Delta queries (warehouse, analytics) run locally in a driver process of their own at that
lower priority, and the kernel gives search and cache the CPU first whenever both want it; the Delta
queries get what is left, and all of it when the others are idle. Not the default: on a saturated
machine what is left can be nothing for minutes (measured: docs/apply.md, "Two drivers"). Each driver
writes its own report; `status_files` finds them all for the readers.
"""

from __future__ import annotations

import json
from pathlib import Path

from spark_jobs.model.settings import JobSettings
from spark_jobs.model.sink_registry import DELTA_SINKS
from spark_jobs.runtime.keep_alive import Child


def children(settings: JobSettings, argv: list[str]) -> list[Child]:
    """One driver for every query, or (`delta_driver_nice` set) the shipping queries in one driver and
    the Delta queries in another, at that nice value."""
    if settings.delta_driver_nice is None:
        return [Child(argv)]
    groups = {
        "shipping": ([sink for sink in settings.sinks if sink not in DELTA_SINKS], 0),
        "delta": ([sink for sink in settings.sinks if sink in DELTA_SINKS], settings.delta_driver_nice),
    }
    return [
        Child(argv, env={"TIDE_JOB_SINKS": json.dumps(sinks),
                         "TIDE_JOB_STATUS_FILE": str(group_status_file(settings.status_file, group))}, nice=nice)
        for group, (sinks, nice) in groups.items() if sinks
    ]


def group_status_file(status_file: Path, group: str) -> Path:
    """Where the driver of `group` reports: `status.json` becomes `status.delta.json`."""
    return status_file.with_name(f"{status_file.stem}.{group}{status_file.suffix}")


def status_files(status_file: Path) -> list[Path]:
    """Every report there is: one driver's `status_file`, or each group's."""
    found = sorted(status_file.parent.glob(f"{status_file.stem}.*{status_file.suffix}"))
    return [path for path in [status_file, *found] if path.exists()]


__all__ = ["children", "group_status_file", "status_files"]
