"""Keep the local driver alive: run it as a child process and start it again when it dies.

`supervise` restarts a failed query, but not a dead JVM: an OutOfMemoryError (measured in the drain
benchmark with a 1g heap) or a crash ends the driver process, and every sink stopped until someone ran
`tide jobs start`. The local stack therefore runs `python -m spark_jobs --keep-alive`: this parent
holds no Spark state and restarts the driver with back-off. Checkpoints make a restart safe: each query
resumes where it last committed. Containers get the same from their restart policy, clusters from
their manager (`spark-submit --supervise`).

A refused configuration is not retried (it would fail the same way), and a stop asked for
(SIGTERM/SIGINT) is passed to the driver and ends the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs.runtime.backoff import Backoff

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("tideline.keep_alive")

# The driver's exit status when its configuration is refused (sysexits' EX_CONFIG): not retried.
CONFIG_REFUSED = 78
# The driver's exit status when its JVM died under it (sysexits' EX_SOFTWARE): restarted.
JVM_DIED = 70
# The driver's exit status when it asks to be started again (sysexits' EX_TEMPFAIL): a reload of
# pipeline.yaml gave its real-time queries more partitions than its session has task slots.
RESTART = 75
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How long a failed driver loop waits to see whether the JVM ended (its sockets close as it exits).
JVM_EXIT_WAIT_S = 5.0


def restarts_after(status: int, stopping: bool) -> bool:
    """Whether a driver that exited with `status` (negative: killed by that signal) is started again."""
    return not stopping and status not in (0, CONFIG_REFUSED)


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it when this parent dies, even by SIGKILL, so a
    killed keep-alive never leaves a driver running that a new one would race on the checkpoints."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Child:
    """One driver process the keep-alive runs: its command, its environment on top of this process's,
    and its CPU priority (a nice value; higher is lower priority)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    nice: int = 0


@dataclass
class _Running:
    child: Child
    backoff: Backoff
    process: subprocess.Popen | None = None
    began: float = 0.0
    start_at: float = 0.0
    final: int | None = None  # its last exit status once it is not to be started again


def run(argv: list[str], backoff: Backoff | None = None) -> int:
    """Run `argv` until it exits cleanly, its configuration is refused, or this process is told to stop."""
    return run_all([Child(argv)], (lambda: backoff) if backoff else None)


def run_all(children: list[Child], backoff: Callable[[], Backoff] | None = None) -> int:
    """Run every child, each started again on its own when it dies, until each has exited cleanly or had
    its configuration refused, or this process is told to stop (passed to every child). Returns 0, or
    the first child's final status that was not 0."""
    fresh = backoff or (lambda: Backoff(healthy_after_s=60.0))  # a driver that ran a minute was healthy
    running = [_Running(child, fresh()) for child in children]
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for each in running:
            if each.process is not None and each.process.poll() is None:
                each.process.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while any(each.final is None for each in running):
        for each in running:
            _step(each, stopping)
        time.sleep(0.2)  # poll: children exit and back-offs end on their own clocks
    return 0 if stopping else next((each.final for each in running if each.final), 0)


def _step(each: _Running, stopping: bool) -> None:
    """Start `each` when due, or note its exit: to be started again after its back-off, or final."""
    now = time.monotonic()
    if each.final is not None:
        return
    if each.process is None:
        if stopping:
            each.final = 0
        elif now >= each.start_at:
            each.process = _start(each.child)
            each.began = now
        return
    status = each.process.poll()
    if status is None:
        return
    each.process = None
    if not restarts_after(status, stopping):
        each.final = 0 if stopping else status
        return
    wait = each.backoff.after(now - each.began)
    log.error("the driver %s exited with status %s; starting it again in %.0fs", each.child.argv, status, wait)
    each.start_at = now + wait


def _start(child: Child) -> subprocess.Popen:
    def prepare() -> None:
        _die_with_parent()
        os.nice(child.nice)

    return subprocess.Popen(child.argv, env={**os.environ, **child.env}, preexec_fn=prepare)


def launched_jvm(spark: SparkSession) -> subprocess.Popen | None:
    """The JVM this Python process launched, None under spark-submit (a cluster: the JVM started Python)."""
    return getattr(spark.sparkContext._gateway, "proc", None)


def exit_with_the_jvm(jvm: subprocess.Popen | None) -> None:
    """End this driver process at once when the JVM it launched ends. Measured: a driver whose JVM was
    killed mid-batch stayed alive for minutes, its main thread blocked on a logging lock while py4j
    tore its connections down, so the keep-alive never started it again. `os._exit` waits for no lock
    and no thread. Under spark-submit (a cluster) the JVM started Python, not the reverse: no watch."""
    if jvm is None:
        return
    threading.Thread(target=lambda: _exit_as_dead(jvm.wait()), name="jvm-watch", daemon=True).start()


def run_until_the_jvm_ends(jvm: subprocess.Popen | None, work: Callable[[], None]) -> None:
    """Run `work` (the driver's loop). If it fails and the JVM has ended, end this process at once.
    Returning the error instead starts Python's own exit, which froze the watch thread above before it
    could exit and then waited forever for a logging lock a frozen py4j thread held (seen in CI: the
    JVM killed, its driver hung, nothing restarted it)."""
    try:
        work()
    except BaseException:
        if jvm is not None:
            try:
                status = jvm.wait(timeout=JVM_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                status = None  # the JVM lives: the failure is the driver's own, reported as usual
            if status is not None:
                _exit_as_dead(status)
        raise


def _exit_as_dead(status: int) -> None:
    os.write(2, f"the driver's JVM ended with status {status}; the driver exits\n".encode())
    os._exit(JVM_DIED)


def main(children: list[Child]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run_all(children))


__all__ = [
    "CONFIG_REFUSED",
    "JVM_DIED",
    "RESTART",
    "Child",
    "exit_with_the_jvm",
    "launched_jvm",
    "restarts_after",
    "run",
    "run_all",
    "run_until_the_jvm_ends",
]
