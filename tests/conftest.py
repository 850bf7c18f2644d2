"""Shared fixtures. Integration tests run against a stack of real services started
by the project's own stack code, in its own state folder and on its own ports so a
developer's running stack is never touched."""

from __future__ import annotations

import os

import pytest

from services.settings import StackSettings
from services.stack import process, runner
from services.versions import PROJECT_ROOT

# Two checkouts testing at once (e.g. two worktrees) give each its own offset.
_PORT_OFFSET = int(os.environ.get("TIDE_TEST_PORT_OFFSET", "0"))
TEST_STACK = {
    "state_dir": PROJECT_ROOT / ".tideline" / "test",
    "postgres_port": 25432 + _PORT_OFFSET,
    "redis_port": 26379 + _PORT_OFFSET,
    "kafka_port": 29092 + _PORT_OFFSET,
    "kafka_controller_port": 29093 + _PORT_OFFSET,
    "connect_port": 28083 + _PORT_OFFSET,
    "elasticsearch_port": 29200 + _PORT_OFFSET,
    "elasticsearch_transport_port": 29300 + _PORT_OFFSET,
}


@pytest.fixture(scope="session")
def stack_settings() -> StackSettings:
    return StackSettings(**TEST_STACK)


@pytest.fixture(scope="session")
def stack(stack_settings: StackSettings) -> StackSettings:
    """The whole local stack, healthy. Stopped at the end unless it was already running."""
    already_up = all(
        process.running(runner.pid_file(stack_settings, service)) for service in runner.select()
    )
    runner.up(stack_settings)
    yield stack_settings
    if not already_up:
        runner.down(stack_settings)
