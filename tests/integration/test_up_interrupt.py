"""Ctrl-C during `tide up` stops what that `tide up` started, only that, and says so in one line.

A real `tide up` on a private state folder and ports, interrupted once it has started PostgreSQL
(the stack step, the first); Redis was started before it and must stay up.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from services.settings import StackSettings
from services.stack import process, runner
from services.stack.catalogue import CATALOGUE
from services.up import lifecycle
from services.up.cli import INTERRUPTED_EXIT
from tests.conftest import stack_ports
from tests.tide_cli import tide_env
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

PORTS = stack_ports(1)


@pytest.fixture
def settings(tmp_path_factory) -> StackSettings:
    settings = StackSettings(state_dir=tmp_path_factory.mktemp("up-interrupt"), **PORTS)
    yield settings
    lifecycle.down(settings, lambda name, state: None)
    process.purge(settings.state_dir)


def test_ctrl_c_during_up_stops_what_it_started_and_leaves_what_ran_before(settings):
    runner.up(settings, ["redis"])
    redis_before = process.running(runner.pid_file(settings, CATALOGUE["redis"]))
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up"], env=tide_env(settings, ["state_dir", *PORTS]),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        postgres = wait_until(lambda: process.running(runner.pid_file(settings, CATALOGUE["postgres"])), 120,
                              "tide up to start PostgreSQL")
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=180)
    finally:
        up.kill()
    assert up.returncode == INTERRUPTED_EXIT, out + err
    message = err.strip().splitlines()
    assert len(message) == 1 and message[0].startswith("interrupted: tide up stopped what it had started ("), err
    assert "postgres" in message[0] and "redis" not in message[0]
    assert not process.is_running(postgres)
    assert lifecycle.running(settings, lifecycle.PROCESSES) == {"redis"}
    assert process.running(runner.pid_file(settings, CATALOGUE["redis"])) == redis_before
