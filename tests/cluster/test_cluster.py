"""The cluster profile in CI: the session's test stack with a Spark standalone master and two workers (each a
process of its own, started by the stack's own code), and `tide chaos --profile cluster` on it: writers, the
jobs' driver submitting to the master, a worker killed with its executors, then every view verified
twice. The fault itself refuses a run whose executors did not run on every worker before the
kill, or were not started again on the other one after it (services/chaos/faults.py)."""

from __future__ import annotations

import re

import pytest

from services.settings import StackSettings
from services.stack import runner, spark
from tests.chaos_runs import run_profile
from tests.tide_cli import run_tide

# The settings `tide cluster status` needs to find the test stack's master and workers.
CLUSTER_FIELDS = ["state_dir", "spark_workers", "spark_master_port", "spark_master_webui_port",
                  "spark_worker_webui_port"]

pytestmark = pytest.mark.stack


@pytest.fixture
def cluster(stack: StackSettings):
    """The test stack with the cluster profile on: its master and workers started, stopped afterwards."""
    settings = stack.model_copy(update={"spark_workers": 2})
    runner.up(settings)
    yield settings
    runner.stop(settings, spark.members(settings))


def test_cluster_profile_converges_after_a_worker_dies_with_its_executors(cluster, tmp_path):
    report, story = run_profile(cluster, "cluster", tmp_path / "chaos")
    assert [injected.fault for injected in report.injected] == ["spark_worker"], story
    assert report.passed, story
    # What a user sees afterwards: the killed worker back and registered, the other holding the executors.
    shown = run_tide(cluster, "cluster", "status", fields=CLUSTER_FIELDS)
    assert re.search(r"spark-worker-1 +│ ALIVE", shown) and re.search(r"spark-worker-2 +│ ALIVE", shown), shown
