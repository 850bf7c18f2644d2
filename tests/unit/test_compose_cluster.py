"""docker-compose.cluster.yml, the cluster profile's override, checked from the files alone (the run itself:
docs/cluster.md): what it adds, how its containers find each other, and that compose accepts it."""

from __future__ import annotations

import os
import shutil
import subprocess

from services.jobs import driver
from services.settings import StackSettings
from services.stack import kafka, spark
from services.up import lifecycle
from services.versions import PROJECT_ROOT
from tests.unit.compose_files import (
    CLUSTER_FILE,
    COMPOSE_FILE,
    ENV_EXAMPLE,
    cluster_services,
    compose_services,
    container_settings,
    service_env,
    volume_mounts,
)

ADDED = {"kafka-2", "kafka-3", "spark-master", "spark-worker"}


def test_the_override_adds_the_master_a_scalable_worker_and_two_brokers_each_served_and_probed():
    services = cluster_services()
    assert set(services) - set(compose_services()) == ADDED
    for name in ADDED:
        assert services[name]["command"] == ["tide", "serve", name], name
        assert services[name]["healthcheck"]["test"] == ["CMD", "/opt/tideline/docker/healthy.sh", name], name
        assert lifecycle.process_named(name).name == name
    assert lifecycle.process_named("spark-worker") is spark.SCALED_WORKER
    assert lifecycle.process_named("kafka-3").name == kafka.broker(3).name


def test_every_container_of_the_cluster_has_its_settings_and_they_validate(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TIDE_"):
            monkeypatch.delenv(key)
    services = cluster_services()
    for name, service in services.items():
        assert all(key.removeprefix("TIDE_").lower() in StackSettings.model_fields for key in service_env(service))
        settings = container_settings(name, services)
        if name not in ("postgres", "migrate", "redis", "elasticsearch"):
            assert (settings.kafka_brokers, settings.spark_workers) == (3, 2), name


def test_the_jobs_submit_to_the_master_and_the_executors_reach_the_driver_and_every_broker_by_name():
    services = cluster_services()
    jobs = driver.job_settings(container_settings("jobs", services))
    assert (jobs.master, jobs.driver_host, jobs.executors) == ("spark://spark-master:7077", "jobs", 2)
    assert jobs.kafka_bootstrap == "kafka:9092,kafka-2:9094,kafka-3:9095" and jobs.kafka_replication == 3
    second = kafka.broker_values(container_settings("kafka-2", services), 2)
    assert (second["KAFKA_ADVERTISED_HOST"], second["CONTROLLER_HOST"]) == ("kafka-2", "kafka")
    assert set(services["jobs"]["depends_on"]) >= {"spark-worker", "kafka-2", "kafka-3"}
    assert set(services["connect"]["depends_on"]) == {"kafka", "kafka-2", "kafka-3"}


def test_a_worker_in_a_container_registers_under_the_containers_name():
    in_container = StackSettings(_env_file=None, host="0.0.0.0", spark_master_host="spark-master")
    assert spark.worker_host(in_container) not in ("0.0.0.0", "127.0.0.1")
    assert spark.master_url(in_container) == "spark://spark-master:7077"
    assert spark.worker_host(StackSettings(_env_file=None)) == "127.0.0.1"


def test_workers_write_the_jobs_warehouse_and_checkpoints_and_brokers_keep_their_own_storage():
    services = cluster_services()
    jobs, worker = volume_mounts(services["jobs"]), volume_mounts(services["spark-worker"])
    for path, (source, _) in worker.items():
        assert jobs[path][0] == source, path
    for number in (2, 3):
        folder = str(container_settings(f"kafka-{number}", services).state_dir / f"kafka-{number}")
        assert volume_mounts(services[f"kafka-{number}"])[folder][0] == f"kafka-{number}-data"


def test_docker_compose_accepts_the_file_with_its_override_and_scales_the_worker():
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose not found: install Debian's docker-compose package (make setup)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TIDE_")}
    result = subprocess.run([tool, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE_FILE), "-f", str(CLUSTER_FILE),
                             "config", "--services"], capture_output=True, text=True, env=env, cwd=PROJECT_ROOT,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) >= ADDED
