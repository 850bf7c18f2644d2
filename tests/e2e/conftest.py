"""The running pipeline the end-to-end modules share: seeded data, a connector of its own, the apply
driver started the way `tide jobs start` starts it (search and cache in Real-Time Mode), and a
minute of workload. Session-scoped so
every module reuses one running driver instead of starting its own; stopped as soon as no later
test uses it, so it never outlives its users into a test that takes the stack down (test_up.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import psycopg
import pytest
import redis

from services.capture.connector import registration
from services.db import migrate
from services.demo import workload
from services.jobs import driver
from services.settings import StackSettings
from services.stack import postgres, process, runner
from spark_jobs.model.config import PipelineConfig, load
from tests.capture_support import unique_pipeline
from tests.e2e.support import REDIS_DB, WORKLOAD_SECONDS, Workload, write_pipeline
from tests.waiting import wait_until


@dataclass
class RunningPipeline:
    stack: StackSettings
    jobs: StackSettings
    pipeline: PipelineConfig
    writer: Workload
    stopped: bool = False

    def stop(self) -> None:
        """Stop the workload and the driver, and remove the connector and its slot (once)."""
        if self.stopped:
            return
        self.stopped = True
        self.writer.stop.set()
        process.stop(runner.pid_file(self.jobs, driver.SERVICE))
        registration.delete(self.stack, self.pipeline, drop_slot=True)


RUNNING = pytest.StashKey[RunningPipeline]()


@pytest.fixture(scope="session")
def run(request, stack: StackSettings, tmp_path_factory):
    """Seed data, register the connector, start the driver, run the workload for a minute."""
    migrate.upgrade(stack)
    base = unique_pipeline(load(stack.pipeline_file), "apply")
    suffix = base.source.topic_prefix
    tables = {
        name: views.model_copy(update={"search": views.search.model_copy(update={"index": f"{suffix}_{name}"})})
        for name, views in base.tables.items()
    }
    nested = {f"{suffix}_{name}_nested": view for name, view in base.nested.items()}
    pipeline = base.model_copy(update={"tables": tables, "nested": nested})
    state = tmp_path_factory.mktemp("apply")
    write_pipeline(pipeline, state / "pipeline.yaml")
    jobs = stack.model_copy(
        update={
            "state_dir": state,
            "pipeline_file": state / "pipeline.yaml",
            "job_redis_db": REDIS_DB,
            "job_trigger_interval": "1 seconds",
        }
    )
    redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB).flushdb()
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        workload.seed(conn, random.Random(11))

    registration.apply(stack, pipeline)
    runner.start_and_wait(jobs, [driver.SERVICE])
    writer = Workload(stack, seed=12, duration_s=WORKLOAD_SECONDS)
    writer.start()
    wait_until(lambda: writer.done >= 100 or writer.error, 60, "the workload to get going")
    running = request.session.stash[RUNNING] = RunningPipeline(stack, jobs, pipeline, writer)
    yield jobs, pipeline, writer
    running.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared pipeline after the last test that uses it, not at the end of the session."""
    running = item.session.stash.get(RUNNING, None)
    if running is None or running.stopped:
        return
    later = item.session.items[item.session.items.index(item) + 1:]
    if not any("run" in getattr(test, "fixturenames", ()) for test in later):
        running.stop()


