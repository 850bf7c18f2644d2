"""Measuring shared by every scenario: percentiles, per-component CPU and memory from /proc, the machine."""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
K = TypeVar("K")  # a rate's name: a sink's or a stage's


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, p50, p95, p99 and max of `values`, rounded to milliseconds when they are seconds."""
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "count": len(values),
        "p50": rounded(percentile(values, 50)),
        "p95": rounded(percentile(values, 95)),
        "p99": rounded(percentile(values, 99)),
        "max": rounded(max(values) if values else None),
    }


def ratios(rates: Mapping[K, float | None], base: float | None) -> dict[K, float | None]:
    """Each rate as a fraction of `base` (a stage's rate over the one before it, or over the source's
    ceiling), measured in the same run; None where either is unknown or zero. On a shared, noisy
    machine these fractions move less than the absolute rates."""
    return {name: round(rate / base, 4) if rate and base else None for name, rate in rates.items()}


# ---- processes --------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces); None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def process_tree(pid: int, tree: dict[int, list[int]], stop_at: Iterable[int] = ()) -> list[int]:
    """`pid` and all its descendants (postgres' backends, the JVM a Python driver launched), except
    the subtrees rooted at `stop_at` (other components: the stack's services are children of `tide`)."""
    skip = set(stop_at) - {pid}
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(child for child in tree.get(current, ()) if child not in skip)
    return found


def cpu_and_rss(pids: Iterable[int]) -> tuple[float, int]:
    """(CPU seconds used so far, resident bytes now) summed over `pids`, a process tree.

    Each process's own time plus the time of the children it has reaped (cutime, cstime), so a
    backend that exits still counts. Resident bytes are summed per process, so pages that forked
    processes share (Python workers) count once per process."""
    cpu, rss = 0.0, 0
    for pid in pids:
        if fields := _stat_fields(pid):
            # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17; rss (pages) is 24.
            cpu += sum(int(value) for value in fields[11:15]) / CLOCK_TICKS
            rss += int(fields[21]) * PAGE_BYTES
    return cpu, rss


@dataclass
class Sample:
    at: float  # seconds since the sampler started
    cpu_percent: float  # of one core, since the previous sample
    rss_mb: float


class ProcessSampler(threading.Thread):
    """Samples CPU and RSS of each named component (a root pid and its descendants) every `interval_s`.

    `roots()` is called at each sample, so components started later (the jobs driver) are picked up.
    """

    def __init__(self, roots, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="process-sampler")
        self.roots, self.interval_s = roots, interval_s
        self.samples: dict[str, list[Sample]] = {}
        self._last: dict[str, tuple[float, float]] = {}
        self._halt = threading.Event()
        self.began = time.monotonic()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        tree = children_by_parent()
        roots = self.roots()
        for name, pid in roots.items():
            cpu, rss = cpu_and_rss(process_tree(pid, tree, stop_at=roots.values()))
            last_at, last_cpu = self._last.get(name, (now, cpu))
            # A process that leaves the tree unreaped by it (its parent died first) takes its CPU time
            # with it and the total drops; that interval counts as 0, not as a huge negative load.
            busy = 100 * max(0.0, cpu - last_cpu) / (now - last_at) if now > last_at else 0.0
            self._last[name] = (now, cpu)
            self.samples.setdefault(name, []).append(Sample(now - self.began, round(busy, 1), round(rss / 2**20, 1)))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def summary(self, since: float = 0.0, until: float = math.inf) -> dict[str, dict[str, float]]:
        """Per component, between `since` and `until` (sampler seconds): mean and peak CPU %, peak RSS."""
        result = {}
        for name, samples in self.samples.items():
            window = [s for s in samples if since <= s.at <= until]
            if window:
                result[name] = {
                    "cpu_mean_percent": round(sum(s.cpu_percent for s in window) / len(window), 1),
                    "cpu_peak_percent": max(s.cpu_percent for s in window),
                    "rss_peak_mb": max(s.rss_mb for s in window),
                }
        return result

    def series(self) -> dict[str, list[list[float]]]:
        return {name: [[round(s.at, 1), s.cpu_percent, s.rss_mb] for s in samples]
                for name, samples in self.samples.items()}


# ---- the machine ------------------------------------------------------------------------------


def loadavg() -> list[float]:
    return [float(part) for part in Path("/proc/loadavg").read_text().split()[:3]]


def memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def busiest_processes(seconds: float = 2.0, top: int = 8, exclude: Iterable[int] = ()) -> list[dict]:
    """The processes using the most CPU over `seconds` (other helpers' stacks show up here)."""
    skip = set(exclude)

    def snapshot() -> dict[int, tuple[float, str]]:
        seen = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in skip and (fields := _stat_fields(int(entry.name))):
                try:
                    cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                    command = cmdline.replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if command.strip():  # kernel threads and zombies have no command line
                    seen[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / CLOCK_TICKS, command.strip()[:160])
        return seen

    before = snapshot()
    time.sleep(seconds)  # a CPU rate needs two readings some time apart
    after = snapshot()
    busy: list[dict[str, Any]] = [
        {"pid": pid, "cpu_percent": round(100 * (cpu - before[pid][0]) / seconds, 1), "command": command}
        for pid, (cpu, command) in after.items() if pid in before
    ]
    return sorted((b for b in busy if b["cpu_percent"] > 0), key=lambda b: -b["cpu_percent"])[:top]


def machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "cpu_model": next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")), platform.processor(),
        ),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
