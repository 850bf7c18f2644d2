"""`tide serve`: one service in the foreground as a container runs it, and the health check that reads its
probe (docker/healthy.sh). A stand-in service (a Python process that exits when told) so no real
server is needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.settings import StackSettings
from services.stack import runner
from services.stack.service import Service, StackError, Unhealthy
from services.versions import PROJECT_ROOT
from tests.waiting import wait_until

HEALTHY_SH = PROJECT_ROOT / "docker" / "healthy.sh"


# The stand-in service: runs until the file named by its argument exists (or a minute passed, so a test
# that fails never leaves it behind), then exits 0.
STAND_IN = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)  # poll
"""


def _service(probe, on_ready=lambda settings: None, exit_when: Path | None = None) -> Service:
    return Service(
        name="sleeper",
        port_fields=(),
        command=lambda settings: [sys.executable, "-c", STAND_IN, str(exit_when or settings.state_dir / "never")],
        probe=probe,
        on_ready=on_ready,
    )


def _healthy_sh(state_dir: Path, name: str = "sleeper") -> int:
    return subprocess.run([str(HEALTHY_SH), name], env={**os.environ, "TIDE_STATE_DIR": str(state_dir)}).returncode


@pytest.fixture
def settings(tmp_path) -> StackSettings:
    return StackSettings(_env_file=None, state_dir=tmp_path)


def test_serve_records_each_passing_probe_runs_on_ready_once_and_passes_sigterm_on(settings):
    readies: list[str] = []
    service = _service(probe=lambda s: "fine", on_ready=lambda s: readies.append("ready"))
    health = runner.health_file(settings, service)
    seen: list[int] = []

    def container_stops() -> None:
        wait_until(health.exists, 30, "the first passing probe recorded")
        seen.append(_healthy_sh(settings.state_dir))
        os.kill(os.getpid(), signal.SIGTERM)  # what docker-init passes on at `docker stop`

    before = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=container_stops)
    stopper.start()
    code = runner.serve(settings, service)
    stopper.join()
    assert code == 128 + signal.SIGTERM  # the service ended by the signal, reported as a shell does
    assert readies == ["ready"]
    assert seen == [0], "docker/healthy.sh must pass on a fresh record"
    assert not health.exists() and _healthy_sh(settings.state_dir) == 1, "a stopped service is not healthy"
    assert signal.getsignal(signal.SIGTERM) is before, "serve must give the signal back when it returns"


def test_a_stop_signal_ends_a_probe_under_way(settings, monkeypatch):
    """A probe of a service that is shutting down can wait long (Kafka's client: 30 s to bootstrap)."""
    monkeypatch.setitem(runner.SERVE_PROBE_S, True, 0.1)
    calls: list[float] = []
    released = threading.Event()  # set once serve has returned, so the hung probe's thread ends then

    def probe(s: StackSettings) -> str:
        calls.append(time.monotonic())
        if len(calls) > 1:
            released.wait(60)  # the probe under test hangs (a client bootstrapping against a dying service)
        return "fine"

    def container_stops() -> None:
        wait_until(lambda: len(calls) > 1, 30, "a second probe under way")
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=container_stops)
    stopper.start()
    code = runner.serve(settings, _service(probe=probe))
    released.set()
    stopper.join()
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - calls[-1] < 10, "serve waited for the probe instead of the service"


def test_serve_keeps_no_record_while_the_probe_fails_and_returns_the_exit_code(settings):
    exit_now = settings.state_dir / "exit-now"
    failures: list[str] = []

    def probe(s: StackSettings) -> str:
        failures.append("not yet")
        if len(failures) == 2:
            exit_now.touch()  # the service exits after two failed probes
        raise Unhealthy("not yet")

    service = _service(probe=probe, exit_when=exit_now)
    assert runner.serve(settings, service) == 0
    assert not runner.health_file(settings, service).exists()


def test_a_permanent_probe_failure_stops_the_service_and_propagates(settings):
    def probe(s: StackSettings) -> str:
        raise StackError("wrong password")

    began = time.monotonic()
    with pytest.raises(StackError, match="wrong password"):
        runner.serve(settings, _service(probe=probe))
    assert time.monotonic() - began < 30, "the service was left running"


def test_healthy_sh_fails_on_a_stale_record(settings):
    health = runner.health_file(settings, _service(probe=lambda s: "fine"))
    health.parent.mkdir(parents=True)
    health.write_text("fine\n")
    assert _healthy_sh(settings.state_dir) == 0
    an_hour_ago = time.time() - 3600
    os.utime(health, (an_hour_ago, an_hour_ago))
    assert _healthy_sh(settings.state_dir) == 1  # `tide serve` stopped probing: not healthy
    assert _healthy_sh(settings.state_dir, "other") == 1
