"""Real-Time Mode's settings and checks: a local driver sized for its real-time queries, a query that
would be starved (fewer slots than the partitions it reads, which Spark accepts silently) refused in
one line, and a query restarted when its tables' columns change (its plan holds the catalogue)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spark_jobs.model import config
from spark_jobs.model.catalogue import Column
from spark_jobs.model.settings import JobSettings, JobSettingsError, read_settings
from spark_jobs.realtime import (
    CLUSTER_BATCH_SLOTS,
    SlotsError,
    cluster_conf,
    local_master,
    needed_slots,
    outgrown,
    require_slots,
    task_slots_of,
)
from spark_jobs.supervise import columns_changed
from tests.demo_catalogue import demo_catalogue

PIPELINE = config.load()


def test_the_real_time_sinks_are_read_as_a_list_or_names_and_unknown_writers_refused(monkeypatch):
    monkeypatch.setenv("TIDE_JOB_REALTIME_SINKS", "cache")
    assert read_settings().realtime_sinks == ["cache"]
    monkeypatch.setenv("TIDE_JOB_REALTIME_SINKS", '["cache"]')
    assert read_settings().realtime_sinks == ["cache"]
    monkeypatch.setenv("TIDE_JOB_REALTIME_SINKS", "search,cache")
    assert read_settings().realtime_sinks == ["search", "cache"]
    monkeypatch.setenv("TIDE_JOB_REALTIME_SINKS", "")
    assert read_settings().realtime_sinks == [], "empty: every query runs micro-batches"
    monkeypatch.delenv("TIDE_JOB_REALTIME_SINKS")
    assert read_settings().realtime_sinks == ["search", "cache"], "by default, every sink with a JVM writer"
    monkeypatch.setenv("TIDE_JOB_REALTIME_SINKS", "warehouse")
    with pytest.raises(JobSettingsError,
                       match=r"^invalid setting TIDE_JOB_REALTIME_SINKS: .*warehouse cannot run in Real-Time"):
        read_settings()


def test_a_local_driver_gets_a_slot_per_partition_its_real_time_queries_read_on_top_of_its_own():
    partitions = len(PIPELINE.sink_tables("cache")) * PIPELINE.source.partitions
    settings = JobSettings(realtime_sinks=["cache"], master="local[4]")
    assert needed_slots(settings, PIPELINE) == partitions
    assert local_master(settings, PIPELINE) == f"local[{4 + partitions}]"
    assert local_master(JobSettings(realtime_sinks=[], master="local[4]"), PIPELINE) == "local[4]"
    assert local_master(JobSettings(realtime_sinks=["cache"], master="spark://m:7077"), PIPELINE) == "spark://m:7077"
    # A driver that runs only the Delta queries (TIDE_JOB_DELTA_DRIVER_NICE) holds no real-time slots.
    delta_only = JobSettings(realtime_sinks=["cache"], sinks=["warehouse", "analytics"], master="local[4]")
    assert local_master(delta_only, PIPELINE) == "local[4]"


def test_a_reload_that_gives_the_real_time_queries_more_partitions_asks_for_a_larger_local_master():
    settings = JobSettings(master="local[4]")  # search and cache in Real-Time Mode
    started = local_master(settings, PIPELINE)
    one_more = PIPELINE.model_copy(update={"tables": {**PIPELINE.tables, "notes": PIPELINE.tables["products"]}})
    wanted = local_master(settings, one_more)
    assert task_slots_of(wanted) == task_slots_of(started) + 2 * PIPELINE.source.partitions
    assert outgrown(started, settings, one_more) == wanted
    assert outgrown(started, settings, PIPELINE) is None, "the same tables fit"
    assert outgrown(wanted, settings, PIPELINE) is None, "fewer tables fit in the larger session"
    assert outgrown("spark://m:7077", settings, one_more) is None, "a cluster manager's slots are not counted"


def test_slots_are_counted_for_local_masters_only():
    assert (task_slots_of("local[16]"), task_slots_of("local[3,2]"), task_slots_of("spark://m:7077")) == (16, 3, None)


class _Context:
    def __init__(self, master: str, conf: dict[str, str]) -> None:
        self.master, self.conf = master, conf

    def getConf(self) -> _Context:  # noqa: N802 - SparkContext's name
        return self

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.conf.get(key, default)


class _Session:
    """Only the master's name and the cores asked of a cluster are read: the check runs before any query starts."""

    def __init__(self, master: str, **conf: str) -> None:
        self.sparkContext = _Context(master, {key.replace("_", "."): value for key, value in conf.items()})


def test_a_query_that_would_be_starved_is_refused_naming_the_fix():
    require_slots(_Session("local[16]"), "cache", 12, held=0, reserved=4)
    with pytest.raises(SlotsError, match=r"reads 12 Kafka partitions but only 0 of local\[16\]'s 16 task slots are "
                                         r"free \(12 held by other real-time queries, 4 kept .*TIDE_JOB_MASTER"):
        require_slots(_Session("local[16]"), "cache", 12, held=12, reserved=4)


def test_a_cluster_master_is_asked_for_equal_executors_holding_every_real_time_partition_and_the_batch_slots():
    partitions = needed_slots(JobSettings(), PIPELINE)  # search's and cache's
    two = cluster_conf(JobSettings(master="spark://m:7077", executors=2, driver_host="127.0.0.1"), PIPELINE)
    assert two == {"spark.cores.max": str(CLUSTER_BATCH_SLOTS + partitions),
                   "spark.executor.cores": str((CLUSTER_BATCH_SLOTS + partitions) // 2),
                   "spark.executor.memory": "1g", "spark.driver.host": "127.0.0.1"}
    # Standalone starts an executor only with all its cores: three executors get a whole share each.
    three = cluster_conf(JobSettings(master="spark://m:7077", executors=3, executor_memory="2g"), PIPELINE)
    share = -(-(CLUSTER_BATCH_SLOTS + partitions) // 3)
    assert (three["spark.executor.cores"], three["spark.cores.max"]) == (str(share), str(3 * share))
    assert "spark.driver.host" not in three and three["spark.executor.memory"] == "2g"
    assert cluster_conf(JobSettings(master="local[4]"), PIPELINE) == {}
    assert cluster_conf(JobSettings(master=None), PIPELINE) == {}, "spark-submit's own settings decide"


def test_on_a_cluster_the_slots_counted_are_the_cores_asked_for():
    require_slots(_Session("spark://m:7077", spark_cores_max="28"), "cache", 12, held=12, reserved=4)
    with pytest.raises(SlotsError, match=r"only 4 of spark://m:7077's 20 task slots are free .*TIDE_JOB_EXECUTORS"):
        require_slots(_Session("spark://m:7077", spark_cores_max="20"), "cache", 12, held=12, reserved=4)
    require_slots(_Session("spark://m:7077"), "cache", 12, held=12, reserved=4)  # nothing says: a warning only


def test_a_real_time_query_is_restarted_only_when_its_own_tables_columns_changed():
    planned = demo_catalogue()
    customers = planned["customers"]
    added = {**planned, "customers": replace(customers, columns={**customers.columns,
                                                                 "loyalty_tier": Column("loyalty_tier", "TEXT")})}
    assert columns_changed(planned, added, ["customers", "orders"])
    assert not columns_changed(planned, added, ["orders", "products"]), "another table's column is not this query's"
    assert not columns_changed(planned, dict(planned), ["customers"])


def test_a_real_time_query_starts_with_generated_code_and_leaves_the_shared_sessions_conf_as_it_was(spark):
    from spark_jobs.runtime.session import GENERATED_CODE, starting_with

    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false", "the micro-batch queries run interpreted"
    spark.conf.unset("spark.sql.codegen.hugeMethodLimit")
    with starting_with(spark, GENERATED_CODE | {"spark.sql.codegen.hugeMethodLimit": "8000"}):
        assert {key: spark.conf.get(key) for key in GENERATED_CODE} == GENERATED_CODE
        # what a query started here runs with: the copy of the session a query takes at its start
        assert spark._jsparkSession.cloneSession().conf().get("spark.sql.codegen.wholeStage") == "true"
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.hugeMethodLimit") == str(65535), "a key unset before is unset after"
    assert spark._jsparkSession.cloneSession().conf().get("spark.sql.codegen.wholeStage") == "false"
