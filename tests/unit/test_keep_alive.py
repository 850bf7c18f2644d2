"""The local driver's keep-alive: which exits start it again, the back-off, and a real child restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from spark_jobs.runtime.backoff import Backoff
from spark_jobs.runtime.keep_alive import (
    CONFIG_REFUSED,
    JVM_DIED,
    Child,
    restarts_after,
    run,
    run_all,
    run_until_the_jvm_ends,
)
from tests.waiting import wait_until


def test_a_crash_or_a_kill_restarts_and_a_clean_exit_a_refused_config_or_a_stop_do_not():
    assert restarts_after(1, stopping=False)
    assert restarts_after(-signal.SIGKILL, stopping=False)
    assert not restarts_after(0, stopping=False)
    assert not restarts_after(CONFIG_REFUSED, stopping=False)
    assert not restarts_after(1, stopping=True)


def test_back_off_doubles_to_its_bound_and_starts_over_after_a_healthy_run_or_a_reset():
    backoff = Backoff(first_s=1.0, max_s=4.0, healthy_after_s=60.0)
    assert [backoff.after(0.5) for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert backoff.after(59.0) == 4.0
    assert backoff.after(60.0) == 1.0
    assert backoff.after() == 2.0
    backoff.reset()
    assert backoff.after() == 1.0


def test_a_child_that_dies_twice_is_started_again_until_it_exits_cleanly(tmp_path):
    starts = tmp_path / "starts"
    # Dies by SIGKILL on its first start, exits 1 on its second, exits 0 on its third.
    script = (
        "import os, signal, sys; from pathlib import Path\n"
        f"p = Path({str(starts)!r}); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
        "if n == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sys.exit(1 if n == 2 else 0)\n"
    )
    assert run([sys.executable, "-c", script], Backoff(first_s=0.01, max_s=0.01)) == 0
    assert starts.read_text() == "3"


def test_a_refused_configuration_ends_the_loop_with_its_status(tmp_path):
    refused = [sys.executable, "-c", f"import sys; sys.exit({CONFIG_REFUSED})"]
    assert run(refused, Backoff(first_s=0.01)) == CONFIG_REFUSED


def _keep_alive(driver: str) -> subprocess.Popen:
    """A keep-alive process of its own running `driver` (Python source) as its driver."""
    parent = (f"import sys; sys.path.insert(0, {os.getcwd()!r}); from spark_jobs.runtime.keep_alive import run; "
              f"sys.exit(run([sys.executable, '-c', {driver!r}]))")
    return subprocess.Popen([sys.executable, "-c", parent])


def test_the_driver_dies_with_a_killed_keep_alive(tmp_path):
    child_pid = tmp_path / "child.pid"
    keeper = _keep_alive(f"import os, signal; open({str(child_pid)!r}, 'w').write(str(os.getpid())); signal.pause()")
    try:
        pid = int(wait_until(lambda: child_pid.exists() and child_pid.read_text(), 30, "the driver to start"))
        keeper.kill()
        keeper.wait()
        wait_until(lambda: not _alive(pid), 10, "the orphaned driver to die")
    finally:
        keeper.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stop_is_passed_to_the_driver_and_ends_the_loop(tmp_path):
    ready = tmp_path / "ready"
    keeper = _keep_alive(f"import signal; open({str(ready)!r}, 'w').write('1'); signal.pause()")
    wait_until(ready.exists, 30, "the driver to start")
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(timeout=30) == 0


def test_a_driver_whose_jvm_is_killed_exits_even_with_its_main_thread_stuck(tmp_path):
    """The real hang measured: the JVM killed mid-batch, the driver's main thread blocked on a lock
    for good. The driver still ends, with JVM_DIED, so the keep-alive starts it again."""
    jvm_pid = tmp_path / "jvm.pid"
    driver = (
        f"import sys, threading; sys.path.insert(0, {os.getcwd()!r})\n"
        "from pyspark.sql import SparkSession\n"
        "from spark_jobs.runtime.keep_alive import exit_with_the_jvm, launched_jvm\n"
        "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "exit_with_the_jvm(launched_jvm(spark))\n"
        f"open({str(jvm_pid)!r}, 'w').write(str(spark.sparkContext._gateway.proc.pid))\n"
        "stuck = threading.Lock(); stuck.acquire(); stuck.acquire()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", driver])
    try:
        pid = int(wait_until(lambda: jvm_pid.exists() and jvm_pid.read_text(), 120, "the driver's JVM"))
        os.kill(pid, signal.SIGKILL)
        assert child.wait(timeout=60) == JVM_DIED
    finally:
        child.kill()


# A driver whose loop fails because its JVM died: a daemon thread holds the logging lock (as a py4j thread
# frozen mid-log by Python's exit does), so an ordinary exit (atexit's logging.shutdown) would wait forever.
_DRIVER_WITH_A_HELD_LOG_LOCK = """
import logging, subprocess, sys, threading
sys.path.insert(0, {root!r})
from spark_jobs.runtime import keep_alive
logging.basicConfig()
jvm = subprocess.Popen([sys.executable, "-c", "pass"])
held = threading.Event()
def hold():
    logging.getLogger().handlers[0].acquire()
    held.set()
    threading.Event().wait()  # holds the lock for good
threading.Thread(target=hold, daemon=True).start()
held.wait()
def loop():
    jvm.wait()
    raise ConnectionError("Answer from Java side is empty")
{call}
"""


def test_a_driver_loop_failing_because_its_jvm_ended_exits_at_once_whatever_locks_are_held():
    """The hang CI met: the JVM killed, the driver's loop raised, Python's own exit waited for a lock a
    frozen py4j thread held, and the keep-alive never started the driver again. The loop's failure now
    ends the process at once with JVM_DIED. The same script with the bare loop does hang."""
    script = _DRIVER_WITH_A_HELD_LOG_LOCK.format(root=os.getcwd(), call="keep_alive.run_until_the_jvm_ends(jvm, loop)")
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert finished.returncode == JVM_DIED
    assert b"the driver's JVM ended with status 0; the driver exits" in finished.stderr

    bare = subprocess.Popen([sys.executable, "-c",
                             _DRIVER_WITH_A_HELD_LOG_LOCK.format(root=os.getcwd(), call="loop()")],
                            stderr=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            bare.wait(timeout=5)  # the bare loop's exit hangs in logging.shutdown
    finally:
        bare.kill()
        bare.wait()


def test_a_driver_loop_failing_while_its_jvm_lives_raises_its_own_error():
    """Only a dead JVM ends the process at once: the driver's own errors keep their traceback and status."""
    def loop() -> None:
        raise ValueError("a bug of the driver")

    # lives until killed
    jvm = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        with pytest.raises(ValueError, match="a bug of the driver"):
            run_until_the_jvm_ends(jvm, loop)
    finally:
        jvm.kill()
        jvm.wait()


def test_each_child_runs_at_its_priority_and_is_started_again_on_its_own(tmp_path):
    """Two drivers: one dies once and is started again while the other runs on, each at its nice value."""
    def child(name: str, deaths: int) -> Child:
        starts = tmp_path / f"{name}.starts"
        script = (
            "import os, sys; from pathlib import Path\n"
            f"p = Path({str(starts)!r}); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
            f"Path({str(tmp_path / name)!r} + '.nice').write_text(str(os.nice(0)) + ' ' + os.environ['GROUP'])\n"
            f"sys.exit(1 if n <= {deaths} else 0)\n"
        )
        return Child([sys.executable, "-c", script], env={"GROUP": name}, nice=7 if name == "delta" else 0)

    base = os.nice(0)
    assert run_all([child("shipping", 0), child("delta", 1)], lambda: Backoff(first_s=0.01, max_s=0.01)) == 0
    assert (tmp_path / "shipping.starts").read_text() == "1"
    assert (tmp_path / "delta.starts").read_text() == "2"
    assert (tmp_path / "shipping.nice").read_text() == f"{base} shipping"
    assert (tmp_path / "delta.nice").read_text() == f"{min(base + 7, 19)} delta"


def test_one_child_refused_ends_the_loop_with_its_status_once_the_others_end(tmp_path):
    refused = Child([sys.executable, "-c", f"import sys; sys.exit({CONFIG_REFUSED})"])
    clean = Child([sys.executable, "-c", "pass"])
    assert run_all([clean, refused], lambda: Backoff(first_s=0.01)) == CONFIG_REFUSED
