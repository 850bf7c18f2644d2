"""The demo workload at a steady rate: `workload.step` on several connections, paced by one schedule.

Operation i is due at start + i / rate. Workers (one connection and one seeded
random generator each) take the next slot in turn, wait until it is due and run
it; a worker that is late runs at once, so short stalls are caught up. The run
ends at its duration: slots still untaken then are not run, so asking for more
than PostgreSQL (or this machine) sustains gives the highest rate it does, in
the asked time. With one worker the sequence of operations is fully
reproducible from the seed; with several, each worker's own sequence is (which
worker takes which slot depends on timing).

Past 8 connections the workers run in several processes (one Python process
spends much of its time waiting for its own interpreter lock there: measured in
docs/benchmarks.md), each pacing its share of the rate from the same start.

The rate achieved counts operations; the row changes they made come from
PostgreSQL's own statistics counters, read before and after the run.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import psycopg

from services.demo import workload
from services.stack.rows import scalar
from services.stack.service import StackError

# Concurrent operations on the same rows can collide (a renumbered item, a customer deleted while an
# order for it is placed); PostgreSQL rejects one of them, the workload counts it and goes on.
CONFLICTS = (psycopg.errors.IntegrityError, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
DEMO_TABLES = ("customers", "products", "orders", "order_items")
CONNECTIONS_PER_PROCESS = 8
MAX_WORKERS = 32
START_TIMEOUT_S = 60.0


class Pacer:
    """Hands out operation slots due at start + i / rate, until `ends_at` (seconds on `clock`)."""

    def __init__(self, rate: float, start: float, ends_at: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate, self.start, self.ends_at, self.clock = rate, start, ends_at, clock
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """The due time of the next slot, or None once the next slot falls after the end or the end
        has passed (a late run is not stretched past its duration to run every slot)."""
        with self._lock:
            due = self.start + self._next / self.rate
            if due >= self.ends_at or self.clock() >= self.ends_at:
                return None
            self._next += 1
            return due

    @property
    def offered(self) -> int:
        return self._next


@dataclass
class LoadReport:
    """What a run did: operations that changed something, ones that found nothing to do, conflicts,
    and the row changes PostgreSQL counted meanwhile (None until the run has ended)."""

    rate: float
    workers: int
    processes: int = 1
    seconds: float = 0.0
    done: int = 0
    idle: int = 0
    conflicts: int = 0
    by_operation: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    row_changes: int | None = None

    @property
    def operations(self) -> int:
        return self.done + self.idle + self.conflicts

    @property
    def achieved_rate(self) -> float:
        """Operations run per second (changes committed or not), over the run's wall time."""
        return self.operations / self.seconds if self.seconds else 0.0

    @property
    def row_changes_per_s(self) -> float | None:
        return self.row_changes / self.seconds if self.row_changes is not None and self.seconds else None

    def add(self, other: LoadReport) -> None:
        """Count another process's operations into this report (same run, same clock)."""
        self.done, self.idle = self.done + other.done, self.idle + other.idle
        self.conflicts += other.conflicts
        for name, count in other.by_operation.items():
            self.by_operation[name] = self.by_operation.get(name, 0) + count
        self.errors += other.errors

    def as_dict(self) -> dict:
        per_s = self.row_changes_per_s
        return {
            "target_rate": self.rate,
            "workers": self.workers,
            "processes": self.processes,
            "seconds": round(self.seconds, 3),
            "operations": self.operations,
            "changed": self.done,
            "nothing_to_do": self.idle,
            "conflicts": self.conflicts,
            "achieved_rate": round(self.achieved_rate, 2),
            "row_changes": self.row_changes,
            "row_changes_per_s": None if per_s is None else round(per_s, 1),
            "by_operation": dict(sorted(self.by_operation.items())),
            "errors": self.errors[:10],
        }


def workers_for(rate: float) -> int:
    """One connection per 50 operations/s asked (an operation takes 1-2 ms on an idle machine, far
    more under load), between 1 and MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, round(rate / 50)))


def processes_for(workers: int) -> int:
    return math.ceil(workers / CONNECTIONS_PER_PROCESS)


def row_changes(conn: psycopg.Connection) -> int:
    """Inserted + updated + deleted rows of the demo tables so far (PostgreSQL's statistics counters;
    a statement that failed still counts the rows it had changed)."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counts; others flush within a second
    return scalar(
        conn,
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables "
        "WHERE relname = ANY(%s)", (list(DEMO_TABLES),),
    )


def settled_row_changes(conn: psycopg.Connection, timeout_s: float = 5.0) -> int:
    """row_changes() once two reads 0.3 s apart agree: the workers' sessions flush their counts as
    they close, a moment after the run ends."""
    deadline, last = time.monotonic() + timeout_s, row_changes(conn)
    while time.monotonic() < deadline:
        time.sleep(0.3)  # poll: other sessions' counters arrive on their own schedule
        if (now := row_changes(conn)) == last:
            break
        last = now
    return last


def run(
    conninfo: str,
    rate: float,
    duration_s: float,
    seed: int = 0,
    workers: int | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[LoadReport], None] | None = None,
    processes: int | None = None,
) -> LoadReport:
    """Drive the workload at `rate` operations/s for `duration_s` seconds (or until `stop` is set)."""
    workers = workers or workers_for(rate)
    processes = max(1, min(processes or processes_for(workers), workers))
    stop = stop or threading.Event()
    with psycopg.connect(conninfo, autocommit=True) as counters:
        before = row_changes(counters)
        if processes == 1:
            report = _threads(conninfo, rate, duration_s, seed, range(workers), stop, on_progress)
        else:
            report = _processes(conninfo, rate, duration_s, seed, workers, processes, stop, on_progress)
        report.row_changes = settled_row_changes(counters) - before
    return report


def _threads(conninfo: str, rate: float, duration_s: float, seed: int, indexes: range, stop: threading.Event,
             on_progress: Callable[[LoadReport], None] | None, began: float | None = None) -> LoadReport:
    """Workers `indexes` (their seeds' names) as threads of this process, sharing one pacer."""
    report = LoadReport(rate=rate, workers=len(indexes))
    lock = threading.Lock()
    began = time.monotonic() if began is None else began
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

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"load-{i}") for i in indexes]
    for thread in threads:
        thread.start()
    while alive := [thread for thread in threads if thread.is_alive()]:
        alive[0].join(timeout=1.0)  # wakes at least once a second to report progress
        report.seconds = time.monotonic() - began
        if on_progress:
            on_progress(report)
    report.seconds = time.monotonic() - began
    return report


def _processes(conninfo: str, rate: float, duration_s: float, seed: int, workers: int, processes: int,
               stop: threading.Event, on_progress: Callable[[LoadReport], None] | None) -> LoadReport:
    """The workers split over `processes` child processes (`python -m services.demo.load`), started
    together once all are ready; each paces its share of the rate. They talk JSON lines: the job
    and the start time in on stdin (closing it stops a child), counts and the report out on stdout."""
    shares = [range(workers * p // processes, workers * (p + 1) // processes) for p in range(processes)]
    children = [_LoadProcess({"conninfo": conninfo, "rate": rate * len(share) / workers, "duration_s": duration_s,
                              "seed": seed, "first": share.start, "last": share.stop}) for share in shares]
    report = LoadReport(rate=rate, workers=workers, processes=processes)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(child.ready.wait(0.1) or child.ended() for child in children):
            if time.monotonic() > deadline:
                raise LoadError(f"load processes not ready within {START_TIMEOUT_S:.0f}s")
        start = time.monotonic() + 0.1
        for child in children:
            child.send({"start": start})
        while not all(child.finished.wait(1.0) or child.ended() for child in children):
            if stop.is_set():
                for child in children:
                    child.close()
            if on_progress:
                progress = LoadReport(rate=rate, workers=workers, processes=processes, seconds=time.monotonic() - start)
                for child in children:
                    progress.add(child.progress)
                on_progress(progress)
    finally:
        for child in children:
            child.close()
            child.wait()
    for child in children:
        report.add(child.report
                   or LoadReport(rate, 0, errors=[f"a load process ended without a report: {child.stderr()}"]))
        report.seconds = max(report.seconds, child.report.seconds if child.report else 0.0)
    return report


class LoadError(StackError):
    """The load processes could not start or run (the message says which and why)."""


class _LoadProcess:
    """One child process and the thread reading its lines."""

    def __init__(self, job: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "services.demo.load"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.ready, self.finished = threading.Event(), threading.Event()
        self.progress = LoadReport(rate=job["rate"], workers=0)
        self.report: LoadReport | None = None
        self.send(job)  # on stdin, not the command line: the conninfo holds a password
        threading.Thread(target=self._read, daemon=True, name="load-process-reader").start()

    def send(self, message: dict) -> None:
        if self.proc.stdin is None:  # never: started with stdin=PIPE
            return
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it has ended; its report (or its absence) says why

    def _read(self) -> None:
        for line in self.proc.stdout or ():  # stdout=PIPE: never None
            message = json.loads(line)
            if "ready" in message:
                self.ready.set()
            elif "progress" in message:
                self.progress = LoadReport(**message["progress"])
            elif "report" in message:
                self.report = LoadReport(**message["report"])
                self.finished.set()

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def close(self) -> None:
        """Stop it: it finishes the operations under way and reports."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        return (self.proc.stderr.read() if self.proc.stderr and self.ended() else "").strip()[-300:]


def _child() -> None:
    """A load process: read the job, say ready, wait for the start time, run, report; stop early
    when stdin closes."""
    job = json.loads(sys.stdin.readline())
    out_lock = threading.Lock()

    def say(message: dict) -> None:
        with out_lock:
            print(json.dumps(message), flush=True)

    say({"ready": True})
    first = sys.stdin.readline()
    if not first:
        return
    stop = threading.Event()

    def stop_at_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_at_eof, daemon=True).start()
    report = _threads(job["conninfo"], job["rate"], job["duration_s"], job["seed"], range(job["first"], job["last"]),
                      stop, lambda progress: say({"progress": asdict(progress)}), began=json.loads(first)["start"])
    say({"report": asdict(report)})


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


if __name__ == "__main__":
    _child()
