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
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger("tideline.keep_alive")

# The driver's exit status when its configuration is refused (sysexits' EX_CONFIG): not retried.
CONFIG_REFUSED = 78
# A driver that ran this long was healthy: its next failure restarts quickly again.
HEALTHY_AFTER_S = 60.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass
class Backoff:
    first_s: float = 1.0
    max_s: float = 30.0
    current_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.current_s = self.first_s

    def after(self, ran_s: float) -> float:
        """Seconds to wait before the next start, given how long the last one ran."""
        if ran_s >= HEALTHY_AFTER_S:
            self.current_s = self.first_s
        wait, self.current_s = self.current_s, min(self.current_s * 2, self.max_s)
        return wait


def restarts_after(status: int, stopping: bool) -> bool:
    """Whether a driver that exited with `status` (negative: killed by that signal) is started again."""
    return not stopping and status not in (0, CONFIG_REFUSED)


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it when this parent dies, even by SIGKILL, so a
    killed keep-alive never leaves a driver running that a new one would race on the checkpoints."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run(argv: list[str], backoff: Backoff | None = None) -> int:
    """Run `argv` until it exits cleanly, its configuration is refused, or this process is told to stop."""
    backoff = backoff or Backoff()
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        began = time.monotonic()
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
        status = child.wait()
        if not restarts_after(status, stopping):
            return 0 if stopping else status
        wait = backoff.after(time.monotonic() - began)
        log.error("the driver exited with status %s; starting it again in %.0fs", status, wait)
        deadline = time.monotonic() + wait
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)  # back-off, cut short by a stop
        if stopping:
            return 0


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run([sys.executable, "-m", "spark_jobs"]))


__all__ = ["CONFIG_REFUSED", "Backoff", "restarts_after", "run"]
