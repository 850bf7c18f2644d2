"""`tide up` / `tide down`: the whole pipeline in order, each step waiting on the previous one's health.

Steps: the service stack, migrations, (the demo data set), the Debezium connector, the Spark
apply jobs, the query API. Each step is the same function the area's own command uses; this
module only orders them. Interrupted, `up` stops exactly the processes it started itself.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import psycopg

from services.api import server
from services.capture import objects
from services.capture.connector import registration
from services.capture.source import setup as source_setup
from services.db.cli import database_errors, first_line
from services.demo import workload
from services.jobs import driver
from services.settings import MOST_BROKERS, StackSettings
from services.stack import kafka, postgres, process, runner, spark
from services.stack.members import MEMBERS, every_member, managed
from services.stack.rows import scalar
from services.stack.runner import Report
from services.stack.service import Service, StackError

# The processes `up` starts after the stack's members: the jobs' driver, then the query API.
APPLICATION: list[Service] = [driver.SERVICE, server.SERVICE]
# Every process `up` starts without the cluster profile, in start order (`down` stops them last first).
PROCESSES: list[Service] = [*MEMBERS.values(), *APPLICATION]


def processes(settings: StackSettings) -> list[Service]:
    """Every process `up` may have started for this stack, the cluster profile's included, in start order."""
    return [*every_member(settings), *APPLICATION]


# What `tide serve` runs (a container's command): every process of `up`, and the cluster profile's Spark
# master, a worker (as many containers as `--scale` says) and Kafka brokers (docker-compose.cluster.yml).
SERVED: list[Service] = [*PROCESSES, spark.MASTER_SERVICE, spark.SCALED_WORKER, *kafka.brokers(MOST_BROKERS)[1:]]


def process_named(name: str) -> Service:
    """One of SERVED by name; a StackError naming the choices otherwise."""
    for service in SERVED:
        if service.name == name:
            return service
    raise StackError(f"unknown service {name}; choose one of {', '.join(service.name for service in SERVED)}")


# The demo data set is fixed: the same seed gives the same rows on every machine.
DEMO_SEED = 20260101


@dataclass(frozen=True)
class Step:
    name: str
    # Does the step (reporting progress) and returns a short line saying what is now true.
    run: Callable[[StackSettings, Report], str]


def start_stack(settings: StackSettings, report: Report) -> str:
    runner.up(settings, report=report)
    started = ", ".join(managed(settings))
    return f"{started} healthy; your PostgreSQL answers" if settings.source_external else f"{started} healthy"


def prepare_source(settings: StackSettings, report: Report) -> str:
    """Your PostgreSQL: preflight, then the capture objects (never your tables), each step stated."""
    lines = source_setup.run(settings, objects.load_pipeline(settings), lambda line: report("source", line))
    return "; ".join(lines)


def migrate(settings: StackSettings, report: Report) -> str:
    from services.db import migrate  # here, not at import time: `tide down` need not load SQLAlchemy and Alembic

    with database_errors(settings):
        migrate.upgrade(settings)
        return f"database {settings.postgres_db} at revision {migrate.current(settings)}"


def load_demo(settings: StackSettings, report: Report) -> str:
    """The small fixed demo data set, in one transaction, unless the source already has customers."""
    try:
        with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
            if scalar(conn, "SELECT EXISTS (SELECT 1 FROM customers)"):
                return "skipped: customers already has rows"
            with conn.transaction():
                workload.seed(conn, random.Random(DEMO_SEED))
            counts = [
                f"{scalar(conn, f'SELECT count(*) FROM {table}')} {table}"
                for table in ("customers", "products", "orders", "order_items")
            ]
    except psycopg.Error as exc:
        raise StackError(f"the demo data set was not loaded (nothing of it was kept): {first_line(exc)}") from exc
    return "loaded " + ", ".join(counts)


def apply_connector(settings: StackSettings, report: Report) -> str:
    pipeline = objects.load_pipeline(settings)
    registration.apply(settings, pipeline)
    return f"connector {pipeline.source.connector} running; tables {', '.join(pipeline.tables)}"


def start_process(service: Service) -> Step:
    """A step that starts one managed process (jobs driver, API) and waits for its health probe."""

    def run(settings: StackSettings, report: Report) -> str:
        runner.start_and_wait(settings, [service], report)
        return service.probe(settings)

    return Step(service.name, run)


def steps(settings: StackSettings, demo: bool) -> list[Step]:
    """The plan: Tideline's own PostgreSQL is migrated (and may get the demo data); yours gets only
    what capture needs."""
    if settings.source_external and demo:
        raise StackError("--demo loads the demo tables into Tideline's own PostgreSQL, and TIDE_POSTGRES_URL "
                         "names yours: drop --demo, or unset TIDE_POSTGRES_URL to try the demo")
    database = [Step("source", prepare_source)] if settings.source_external else [
        Step("migrations", migrate), *([Step("demo data", load_demo)] if demo else [])]
    return [
        Step("stack", start_stack),
        *database,
        Step("connector", apply_connector),
        start_process(driver.SERVICE),
        start_process(server.SERVICE),
    ]


class Display(Protocol):
    def begin(self, step: str) -> Report: ...

    def done(self, step: str, detail: str) -> None: ...


class Interrupted(Exception):
    """`up` was interrupted (Ctrl-C); `stopped` names the processes it had started and then stopped."""

    def __init__(self, stopped: list[str]) -> None:
        super().__init__(", ".join(stopped))
        self.stopped = stopped


def running(settings: StackSettings, services: list[Service]) -> set[str]:
    return {service.name for service in services if process.running(runner.pid_file(settings, service))}


@contextmanager
def _uninterruptible() -> Iterator[None]:
    """A second Ctrl-C must not abandon the clean-up half way."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def up(settings: StackSettings, plan: list[Step], display: Display) -> None:
    """Run each step in order. On Ctrl-C, stop what this call started (not what already ran) and raise
    Interrupted. Any other failure leaves what runs running, to inspect (`tide stack status`, logs)."""
    every = processes(settings)
    before = running(settings, every)
    try:
        for step in plan:
            report = display.begin(step.name)
            display.done(step.name, step.run(settings, report))
    except KeyboardInterrupt:
        with _uninterruptible():
            stopped = runner.stop(settings, [service for service in every if service.name not in before])
        raise Interrupted(stopped) from None


def down(settings: StackSettings, report: Report) -> list[str]:
    """Stop every process `up` starts, API and jobs first, then the stack. Data stays."""
    return runner.stop(settings, processes(settings), report)
