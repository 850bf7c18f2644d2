"""Helpers shared by the end-to-end modules: the paced demo workload and the `tide` command line."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import yaml

from services.demo import workload
from services.settings import StackSettings
from services.stack import postgres
from spark_jobs.config import PipelineConfig
from tests import tide_cli
from tests.tide_cli import TIDE  # noqa: F401 - re-exported for the e2e modules
from tests.conftest import TEST_STACK

WORKLOAD_SECONDS = 60
REDIS_DB = 3  # the apply jobs' Redis database on the shared test stack


class Workload(threading.Thread):
    """The demo workload at a steady pace until stopped (pacing, not synchronisation)."""

    def __init__(self, settings: StackSettings, seed: int, duration_s: float = 3600, pause_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.settings, self.rnd, self.pause_s = settings, random.Random(seed), pause_s
        self.ends_at = time.monotonic() + duration_s
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(postgres.conninfo(self.settings), autocommit=True) as conn:
                while not self.stop.wait(self.pause_s) and time.monotonic() < self.ends_at:
                    if workload.step(conn, self.rnd):
                        self.done += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test that stops it
            self.error = exc

    def finish(self, stop: bool = True) -> int:
        if stop:
            self.stop.set()
        self.join(timeout=120)
        assert not self.is_alive(), "the workload did not stop"
        assert self.error is None, self.error
        return self.done


def write_pipeline(pipeline: PipelineConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, mode="json")))




# The settings that point the `tide` command line at the tests' pipeline and stack.
E2E_FIELDS = (*TEST_STACK, "pipeline_file", "job_redis_db", "job_trigger_interval")


def tide_env(jobs: StackSettings) -> dict[str, str]:
    return tide_cli.tide_env(jobs, E2E_FIELDS)


def tide(jobs: StackSettings, *args: str) -> str:
    """Run the `tide` command line against the tests' pipeline; its output, or fail with it."""
    return tide_cli.run_tide(jobs, *args, fields=E2E_FIELDS)


