"""Shared fixtures. Integration tests run against a stack of real services started
by the project's own stack code, in its own state folder and on its own ports so a
developer's running stack is never touched."""

from __future__ import annotations

import os

import pytest

from services.settings import StackSettings
from services.stack import process, runner
from services.versions import PROJECT_ROOT

# Two checkouts testing at once (e.g. two worktrees) give each its own offset: 1000, 2000 or 3000.
# Those keep every port below Linux's ephemeral range (32768-60999, where a client's own port could
# take ours) and clear of the other checkouts' ports; small offsets collide (100 puts one's
# Elasticsearch HTTP port on another's transport port).
_PORT_OFFSET = int(os.environ.get("TIDE_TEST_PORT_OFFSET", "0"))

# Every driver the tests start (directly or through `tide`) inherits these. The Delta queries' longer
# default intervals (10 s and 30 s: fewer, larger batches under steady load) only add an idle wait for the
# next trigger once the writes stop, which is when a test waits for every sink to catch up; under load
# their batches outlast either interval.
os.environ.setdefault("TIDE_JOB_WAREHOUSE_TRIGGER_INTERVAL", "2 seconds")
os.environ.setdefault("TIDE_JOB_ANALYTICS_TRIGGER_INTERVAL", "2 seconds")
# The tests' drivers live for minutes and are killed and started again often: with the JIT's quick
# compiler alone (and the code cache a tiered JIT gets, so it is not swept) they spend less CPU compiling
# than they lose running C1's code. Measured on two e2e tests (docs/testing.md): the drivers' CPU 266 s
# instead of 327, of which compiling 18 s instead of 117. Users' drivers keep HotSpot's default.
os.environ.setdefault("TIDE_JOB_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")


def stack_ports(band: int, shift: int = 0) -> dict[str, int]:
    """Every service port at `band`0000 + the usual port + `shift`, plus this checkout's offset.
    Bands 1 and 2 only (below the ephemeral range); `shift` 20 gives a second stack in a band."""
    usual = {
        "postgres_port": 5432,
        "redis_port": 6379,
        "kafka_port": 9092,
        "kafka_controller_port": 9093,
        "connect_port": 8083,
        "elasticsearch_port": 9200,
        "elasticsearch_transport_port": 9300,
        "api_port": 8000,
        "spark_master_port": 7077,
        "spark_master_webui_port": 8080,
        "spark_worker_webui_port": 8091,
        "kafka_broker_port": 9094,
    }
    return {name: band * 10_000 + port + shift + _PORT_OFFSET for name, port in usual.items()}


def compose_ports() -> dict[str, int]:
    """Host ports the compose end-to-end test publishes its stack on (as TIDE_<NAME>_PORT): 61000 plus
    the last three digits of the usual port, plus this checkout's offset. Above Linux's ephemeral range
    and clear of bands 1 and 2 (with any offset up to 3000 they stay below 65536 and apart)."""
    usual = {"postgres_port": 5432, "redis_port": 6379, "elasticsearch_port": 9200, "api_port": 8000}
    return {name: 61_000 + port % 1000 + _PORT_OFFSET for name, port in usual.items()}


TEST_STACK = {"state_dir": PROJECT_ROOT / ".tideline" / "test", **stack_ports(2)}
# Ports of a stack that `tide up` starts from nothing in a test (band 1, below the ephemeral range).
UP_PORTS = stack_ports(1)
# The settings a `tide` subprocess needs to act on that stack (as TIDE_* variables).
UP_FIELDS = ["state_dir", *UP_PORTS]


@pytest.fixture(scope="session")
def stack_settings() -> StackSettings:
    return StackSettings(**TEST_STACK)


@pytest.fixture(scope="session")
def stack(stack_settings: StackSettings) -> StackSettings:
    """The whole local stack, healthy. Stopped at the end unless it was already running."""
    already_up = all(
        process.running(runner.pid_file(stack_settings, service)) for service in runner.select(stack_settings)
    )
    runner.up(stack_settings)
    yield stack_settings
    if not already_up:
        runner.down(stack_settings)


@pytest.fixture
def fresh_stack(tmp_path_factory) -> StackSettings:
    """An empty state folder on ports of its own (UP_PORTS), for a test that runs `tide up` itself;
    the shared test stack and the session's pipeline on it keep running. Afterwards everything
    `tide up` can start is stopped and the folder is deleted."""
    from services.up import lifecycle  # here: most tests never need the whole CLI

    settings = StackSettings(state_dir=tmp_path_factory.mktemp("up"), **UP_PORTS)
    yield settings
    lifecycle.down(settings, lambda name, state: None)
    process.purge(settings.state_dir)
