"""CPU seconds of processes, read from /proc (bench/sink_batches.py)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def print_python_workers_cpu() -> None:
    """CPU seconds of the local Python workers (`python -m <daemon module>` and its forks, and the
    children they reaped), from /proc."""
    ticks = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            cmd = Path(stat).with_name("cmdline").read_bytes()
            if cmd.split(b"\0")[1:2] == [b"-m"] and b"daemon" in cmd:
                f = Path(stat).read_text().rsplit(")", 1)[1].split()
                ticks += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        except OSError:
            pass
    print(json.dumps({"python_workers_cpu_s": ticks / os.sysconf("SC_CLK_TCK")}), flush=True)
