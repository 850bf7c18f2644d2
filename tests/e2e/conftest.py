"""The e2e fixtures: one apply run (connector, driver, workload) and one Spark session per test session."""

from __future__ import annotations

import random

import psycopg
import pytest
import redis

import migrations
from services.connector import registration
from services.demo import workload
from services.jobs import driver
from services.settings import StackSettings
from services.stack import jars, postgres, process, runner
from spark_jobs.config import load
from spark_jobs.session import build_session
from tests.capture_support import unique_pipeline
from tests.e2e.support import REDIS_DB, WORKLOAD_SECONDS, Workload, write_pipeline
from tests.waiting import wait_until


@pytest.fixture(scope="session")
def spark(stack):
    session = build_session("tideline-apply-test", jars.bundle_dir(stack, "spark"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def run(stack: StackSettings, tmp_path_factory: pytest.TempPathFactory):
    """Seed data, register the connector, start the driver, run the workload for a minute."""
    migrations.upgrade(stack)
    base = unique_pipeline(load(stack.pipeline_file), "apply")
    suffix = base.source.topic_prefix
    tables = {
        name: views.model_copy(update={"search": views.search.model_copy(update={"index": f"{suffix}_{name}"})})
        for name, views in base.tables.items()
    }
    pipeline = base.model_copy(update={"tables": tables})
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
    yield jobs, pipeline, writer
    writer.stop.set()
    process.stop(runner.pid_file(jobs, driver.SERVICE))
    registration.delete(stack, pipeline, drop_slot=True)
