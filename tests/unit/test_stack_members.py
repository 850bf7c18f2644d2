import pytest

from services.settings import StackSettings
from services.stack import runner
from services.stack.members import every_member, members
from services.stack.service import StackError

CLUSTER = StackSettings(spark_workers=2, kafka_brokers=3)


def test_selecting_a_service_brings_what_it_starts_after():
    for service in members(CLUSTER).values():
        selected = {s.name for s in runner.select(CLUSTER, [service.name])}
        assert set(service.after) <= selected


def test_unknown_service_is_a_clear_error():
    with pytest.raises(StackError, match="unknown service nope; known: postgres"):
        runner.select(StackSettings(), ["nope"])


def test_every_port_field_names_a_setting():
    for service in members(CLUSTER).values():
        for field in service.port_fields:
            assert isinstance(getattr(CLUSTER, field), int)


def test_stopping_a_service_stops_what_depends_on_it_but_not_what_it_depends_on():
    assert [s.name for s in runner.with_dependants(CLUSTER, ["connect"])] == ["connect"]
    # The first broker is the cluster's controller: the others stop with it.
    assert [s.name for s in runner.with_dependants(StackSettings(), ["kafka"])] == [
        "kafka", "kafka-2", "kafka-3", "kafka-4", "kafka-5", "connect"]


def test_the_cluster_profile_adds_brokers_after_the_first_and_connect_starts_after_all_of_them():
    names = list(members(CLUSTER))
    assert names[:6] == ["postgres", "redis", "kafka", "kafka-2", "kafka-3", "connect"]
    assert members(CLUSTER)["connect"].after == ("kafka", "kafka-2", "kafka-3")
    assert members(StackSettings())["connect"].after == ("kafka",) and "kafka-2" not in members(StackSettings())
    assert [s.name for s in runner.select(CLUSTER, ["connect"])] == ["kafka", "kafka-2", "kafka-3", "connect"]


def test_the_cluster_profile_adds_a_spark_master_and_its_workers():
    assert "spark-master" not in members(StackSettings())
    assert list(members(CLUSTER))[-3:] == ["spark-master", "spark-worker-1", "spark-worker-2"]
    with pytest.raises(StackError, match="unknown service spark-worker-3"):
        runner.select(CLUSTER, ["spark-worker-3"])


def test_stopping_the_master_stops_every_worker_whatever_the_setting_says_now():
    # Started with three workers, stopped with the setting at two: the third is stopped too.
    stopped = [s.name for s in runner.with_dependants(CLUSTER, ["spark-master"])]
    assert stopped[:4] == ["spark-master", "spark-worker-1", "spark-worker-2", "spark-worker-3"]
    assert "spark-worker-3" in [s.name for s in every_member(StackSettings())]


def test_the_cluster_profiles_jobs_are_submitted_to_its_master_with_an_executor_per_worker(monkeypatch):
    from services.jobs import driver

    monkeypatch.delenv("TIDE_JOB_MASTER", raising=False)
    jobs = driver.job_settings(StackSettings(spark_workers=2, spark_master_port=17077, job_executor_memory="2g"))
    assert (jobs.master, jobs.executors, jobs.executor_memory, jobs.driver_host) == (
        "spark://127.0.0.1:17077", 2, "2g", "127.0.0.1")
    local = driver.job_settings(StackSettings())
    assert (local.master, local.driver_host) == ("local[4]", None), "without the profile: a local driver"


def test_workers_web_ui_ports_count_in_the_distinct_ports_check():
    with pytest.raises(ValueError, match="spark_worker_3_webui_port and connect_port are both set to port 8083"):
        StackSettings(spark_workers=3, spark_worker_webui_port=8081)


def test_a_worker_started_again_is_found_by_its_live_record_and_host_as_well_as_port():
    from services.stack import spark

    settings = StackSettings(spark_workers=2, spark_worker_webui_port=8091)

    def record(host: str, port: int, state: str) -> dict:
        return {"webuiaddress": f"http://{host}:{port}", "state": state}

    lost, again = record("127.0.0.1", 8092, "DEAD"), record("127.0.0.1", 8092, "ALIVE")
    elsewhere = record("10.0.0.9", 8091, "ALIVE")  # another host's worker on the same port
    assert spark.registered_worker(settings, 2, [lost, elsewhere, again]) is again
    assert spark.registered_worker(settings, 2, [lost]) is lost, "a lost worker's record says it is lost"
    assert spark.registered_worker(settings, 1, [lost, elsewhere, again]) is None
