"""The demo workload at a steady rate: `workload.step` on several connections, paced by one schedule.

Operation i is due at start + i / rate. Workers (one connection and one seeded
random generator each) take the next slot in turn, wait until it is due and run
it; a worker that is late runs at once, so short stalls are caught up. With one
worker the sequence of operations is fully reproducible from the seed; with
several, each worker's own sequence is (which worker takes which slot depends
on timing).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from services.demo import workload

# Concurrent operations on the same rows can collide (a renumbered item, a customer deleted while an
# order for it is placed); PostgreSQL rejects one of them, the workload counts it and goes on.
CONFLICTS = (psycopg.errors.IntegrityError, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


class Pacer:
    """Hands out operation slots due at start + i / rate, until `ends_at` (monotonic seconds)."""

    def __init__(self, rate: float, start: float, ends_at: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate, self.start, self.ends_at = rate, start, ends_at
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """The due time of the next slot, or None once the next slot falls after the end."""
        with self._lock:
            due = self.start + self._next / self.rate
            if due >= self.ends_at:
                return None
            self._next += 1
            return due

    @property
    def offered(self) -> int:
        return self._next


@dataclass
class LoadReport:
    """What a run did: operations that changed something, ones that found nothing to do, conflicts."""

    rate: float
    workers: int
    seconds: float = 0.0
    done: int = 0
    idle: int = 0
    conflicts: int = 0
    by_operation: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        """Operations run per second (changes committed or not), over the run's wall time."""
        return (self.done + self.idle + self.conflicts) / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {
            "target_rate": self.rate,
            "workers": self.workers,
            "seconds": round(self.seconds, 3),
            "operations": self.done + self.idle + self.conflicts,
            "changed": self.done,
            "nothing_to_do": self.idle,
            "conflicts": self.conflicts,
            "achieved_rate": round(self.achieved_rate, 2),
            "by_operation": dict(sorted(self.by_operation.items())),
            "errors": self.errors[:10],
        }


def workers_for(rate: float) -> int:
    """One connection carries ~40 operations/s here (each is a few round trips); more run in parallel."""
    return max(1, min(16, round(rate / 40)))


def run(
    conninfo: str,
    rate: float,
    duration_s: float,
    seed: int = 0,
    workers: int | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[LoadReport], None] | None = None,
) -> LoadReport:
    """Drive the workload at `rate` operations/s for `duration_s` seconds (or until `stop` is set)."""
    workers = workers or workers_for(rate)
    report = LoadReport(rate=rate, workers=workers)
    stop = stop or threading.Event()
    lock = threading.Lock()
    began = time.monotonic()
    pacer = Pacer(rate, began, began + duration_s)

    def work(index: int) -> None:
        rnd = random.Random(f"{seed}/{index}")
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                while not stop.is_set() and (due := pacer.take()) is not None:
                    if (wait := due - time.monotonic()) > 0 and stop.wait(wait):
                        break
                    outcome = _one(conn, rnd)
                    with lock:
                        _count(report, outcome)
        except Exception as exc:  # noqa: BLE001 - recorded in the report; the other workers go on
            with lock:
                report.errors.append(f"worker {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"load-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    while alive := [thread for thread in threads if thread.is_alive()]:
        alive[0].join(timeout=1.0)  # wakes at least once a second to report progress
        report.seconds = time.monotonic() - began
        if on_progress:
            on_progress(report)
    report.seconds = time.monotonic() - began
    return report


def _one(conn: psycopg.Connection, rnd: random.Random) -> str:
    try:
        return workload.step(conn, rnd) or "nothing to do"
    except CONFLICTS:
        return "conflict"


def _count(report: LoadReport, outcome: str) -> None:
    if outcome == "conflict":
        report.conflicts += 1
    elif outcome == "nothing to do":
        report.idle += 1
    else:
        report.done += 1
    report.by_operation[outcome] = report.by_operation.get(outcome, 0) + 1
