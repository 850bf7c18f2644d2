"""Ctrl-C during `tide up` stops what that `tide up` started, only that, and says so in one line.

A real `tide up` on a fresh state folder and ports of its own, interrupted once it has started
PostgreSQL (the stack step, the first); Redis was started before it and must stay up.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from services.stack import process, runner
from services.stack.members import MEMBERS
from services.up import lifecycle
from services.up.cli import INTERRUPTED_EXIT
from tests.conftest import UP_FIELDS
from tests.tide_cli import TIDE, tide_env
from tests.waiting import wait_until

pytestmark = pytest.mark.stack


def test_ctrl_c_during_up_stops_what_it_started_and_leaves_what_ran_before(fresh_stack):
    settings = fresh_stack
    runner.up(settings, ["redis"])
    redis_before = process.running(runner.pid_file(settings, MEMBERS["redis"]))
    up = subprocess.Popen([*TIDE, "up"], env=tide_env(settings, UP_FIELDS),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        postgres = wait_until(lambda: process.running(runner.pid_file(settings, MEMBERS["postgres"])), 120,
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
    assert process.running(runner.pid_file(settings, MEMBERS["redis"])) == redis_before
