"""The Spark driver's class archive: the classes a driver loads, parsed and verified once, mapped by every start.

A cold driver JVM spends seconds loading and verifying Spark's, Scala's and Delta's classes before its
first batch. HotSpot's application class-data sharing (CDS) keeps them in an archive that later JVMs map
instead: a cold session, a Delta table's creation and two MERGEs took 12.5-13.7 s instead of 18.3-20.4 s,
22-24 s of JVM CPU instead of 31-35 (docs/apply.md, "Class archive"). Every driver start pays that: the
keep-alive's restarts, `tide rebuild`, `tide verify`, each test session.

`make()` writes the archive (called by `tide stack fetch`, so `make setup`): a driver JVM started with
`-XX:ArchiveClassesAtExit` runs a small workload of what the drivers do (a session, Delta writes and
MERGEs, a streaming query's batches) and exits, and the JVM writes what it loaded. It lives in the
Spark jar folder, so a new set of jars (which empties that folder) drops it. The JVM checks an archive
against its own build and the class path and ignores one that does not match, so a stale archive costs
the speed-up, never a start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ARCHIVE = "driver-classes.jsa"
WORKLOAD = "spark_jobs.runtime.archive_workload"  # the driver whose classes are archived
# The JVM's own notes about an archive it cannot use (e.g. after a JDK update) would fill the driver's log.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
_DEADLINE_S = 300.0


def archive_of(jar_dir: Path) -> Path:
    return jar_dir / ARCHIVE


def reading(jar_dir: Path) -> list[str]:
    """The JVM options that map the archive of `jar_dir`'s jars; none while there is no archive."""
    archive = archive_of(jar_dir)
    return [f"-XX:SharedArchiveFile={archive}", *_QUIET] if archive.is_file() else []


def writing(archive: Path) -> list[str]:
    """The JVM options that write the classes the JVM loaded to `archive` when it exits."""
    return [f"-XX:ArchiveClassesAtExit={archive}", *_QUIET]


def make(jar_dir: Path, log: Path, say: Callable[[str], None] = print) -> Path:
    """Write `jar_dir`'s archive unless it is there: a driver of its own runs the workload (a child
    process, since a JVM writes its archive only as it exits), its output in `log`. Returns the
    archive's path; RuntimeError when none was written."""
    archive = archive_of(jar_dir)
    if archive.is_file():
        return archive
    say(f"writing the Spark driver's class archive ({archive.name}, about a minute)")
    log.parent.mkdir(parents=True, exist_ok=True)
    # Beside the archive, so the finished file is renamed into place, never seen half-written.
    with tempfile.TemporaryDirectory(prefix=".class-archive-", dir=jar_dir) as work, open(log, "wb") as out:
        try:
            result = subprocess.run([sys.executable, "-m", WORKLOAD, str(jar_dir), work],
                                    stdout=out, stderr=subprocess.STDOUT, timeout=_DEADLINE_S)
            code = str(result.returncode)
        except subprocess.TimeoutExpired:
            code = f"none after {_DEADLINE_S:.0f}s"
        written = Path(work) / ARCHIVE
        if not written.is_file():
            raise RuntimeError(f"the Spark driver's class archive was not written (exit {code}); see {log}")
        os.replace(written, archive)
    return archive
