"""The cluster profile in CI: the session's test stack with a Spark standalone master and two workers, and two
Kafka brokers joining its broker (each a process of its own, started by the stack's own code), and `tide
chaos --profile cluster` on it: writers, topics of four partitions with three replicas, the jobs' driver
submitting to the master, a worker killed with its executors and a broker killed, then every view verified
twice. The faults themselves refuse a run whose executors did not run on every worker before the kill, or
were not started again on the other one after it, and a broker kill where the broker led no partition or a
partition had fewer than three replicas in sync (services/chaos/cluster_faults.py)."""

from __future__ import annotations

import re

import pytest

from services.settings import StackSettings
from services.stack import kafka, runner, spark
from tests.chaos_runs import run_profile
from tests.tide_cli import run_tide

# The settings `tide cluster status` needs to find the test stack's master and workers.
CLUSTER_FIELDS = ["state_dir", "spark_workers", "spark_master_port", "spark_master_webui_port",
                  "spark_worker_webui_port", "kafka_brokers", "kafka_port", "kafka_broker_port"]

pytestmark = pytest.mark.stack


@pytest.fixture
def cluster(stack: StackSettings):
    """The test stack with the cluster profile on: its master and workers, and two brokers joining its Kafka,
    started; stopped afterwards."""
    settings = stack.model_copy(update={"spark_workers": 2, "kafka_brokers": 3})
    runner.up(settings)
    yield settings
    runner.stop(settings, [*kafka.brokers(3)[1:], *spark.members(settings)])


def test_cluster_profile_converges_after_a_worker_dies_with_its_executors_and_a_broker_dies(cluster, tmp_path):
    report, story = run_profile(cluster, "cluster", tmp_path / "chaos")
    assert sorted(injected.fault for injected in report.injected) == ["kafka_broker", "spark_worker"], story
    assert report.passed, story
    # What a user sees afterwards: the killed worker and broker back, registered and live.
    shown = run_tide(cluster, "cluster", "status", fields=CLUSTER_FIELDS)
    assert re.search(r"spark-worker-1 +│ ALIVE", shown) and re.search(r"spark-worker-2 +│ ALIVE", shown), shown
    assert all(re.search(rf"{name} +│ live", shown) for name in ("kafka", "kafka-2", "kafka-3")), shown
