"""The status figures' arithmetic, their JSON and Prometheus renderings, and the pause control file (pure)."""

from prometheus_client.parser import text_string_to_metric_families

from services.status import metrics
from services.status.cli import format_age
from services.status.collect import spans
from services.status.figures import (
    SinkFigures,
    SourceFigures,
    Status,
    TableFigures,
    TaskFigures,
    age_s,
    first_commit,
    last_commit,
    query_state,
    to_json,
)
from spark_jobs.runtime.control import read_paused, write_paused

NOW = 1_700_000_100_000


def _table(name: str, behind: int, applied: int | None, unapplied: int | None, dead: int = 0) -> TableFigures:
    return TableFigures(name, f"t.public.{name}", behind, dead, applied, unapplied)


def _status(connector_state: str = "RUNNING", slot_active: bool | None = True) -> Status:
    search = SinkFigures("search", "paused", None, (
        _table("orders", 40, NOW - 90_000, NOW - 85_000, dead=1), _table("customers", 2, NOW - 60_000, NOW - 59_000)),
        follow_up_behind=7)
    cache = SinkFigures("cache", "running", None, (_table("orders", 0, NOW - 1_500, None),))
    source = SourceFigures("tideline-postgres", connector_state, (TaskFigures(0, "RUNNING", None),), "tideline",
                           slot_active is not None, slot_active, 4096 if slot_active is not None else None, "reserved")
    return Status(NOW, 1.5, source, (search, cache), ("Kafka Connect is down",))


def test_ages_count_from_the_commit_and_are_never_negative():
    assert age_s(NOW, NOW - 2_500) == 2.5
    assert age_s(NOW, NOW + 300) == 0  # the source's clock a little ahead
    assert age_s(NOW, None) is None


def test_the_newest_applied_is_the_last_commit_time_and_the_oldest_unapplied_the_first():
    times = [(12, None), (10, 1_000), (11, 2_000), (9, None)]  # offsets out of order; tombstones carry none
    assert last_commit(times) == 2_000
    assert first_commit(times) == 1_000
    assert last_commit([(3, None)]) is None and first_commit([]) is None


def test_a_sink_totals_its_tables_behind_and_takes_the_stalest_freshness():
    sink = _status().sinks[0]
    assert sink.records_behind == 42 and sink.dead_letters == 1
    assert sink.newest_applied_commit_ms == NOW - 60_000  # the newest change applied in any table
    assert sink.oldest_unapplied_commit_ms == NOW - 85_000  # the oldest change waiting in any table


def test_query_state_comes_from_a_fresh_driver_report():
    report = {"written_at_ms": NOW - 3_000, "queries": {
        "search": {"active": False, "paused": True, "last_error": None},
        "cache": {"active": True, "paused": False, "last_error": None},
        "warehouse": {"active": False, "paused": False, "last_error": "Delta is down"}}}
    assert query_state(report, "search", NOW) == ("paused", None)
    assert query_state(report, "cache", NOW) == ("running", None)
    assert query_state(report, "warehouse", NOW) == ("stopped", "Delta is down")
    assert query_state(report, "cache", NOW + 60_000)[0] == "unknown"  # a stale report: no driver
    assert query_state(None, "cache", NOW)[0] == "unknown"
    # Two drivers: one stale report leaves the other driver's queries known.
    report["queries"]["warehouse"]["reported_at_ms"] = NOW - 60_000
    report["queries"]["cache"]["reported_at_ms"] = NOW - 1_000
    assert query_state(report, "warehouse", NOW)[0] == "unknown"
    assert query_state(report, "cache", NOW) == ("running", None)


def test_status_json_carries_each_figure_and_its_age():
    document = to_json(_status())
    search = document["sinks"][0]
    assert (search["sink"], search["state"], search["records_behind"]) == ("search", "paused", 42)
    assert (search["follow_up_records_behind"], document["sinks"][1]["follow_up_records_behind"]) == (7, None)
    assert search["oldest_unapplied_age_s"] == 85.0
    orders = search["tables"][0]
    assert (orders["table"], orders["newest_applied_age_s"], orders["oldest_unapplied_age_s"]) == ("orders", 90.0, 85.0)
    cache_orders = document["sinks"][1]["tables"][0]
    assert cache_orders["oldest_unapplied_age_s"] is None and cache_orders["newest_applied_age_s"] == 1.5
    assert document["source"]["connector_running"] is True
    assert document["source"]["slot_lag_bytes"] == 4096
    assert document["problems"] == ["Kafka Connect is down"]


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def test_prometheus_text_has_a_gauge_per_figure_labelled_by_sink_and_table():
    samples = _samples(metrics.render(_status()))
    search_orders = (("sink", "search"), ("table", "orders"))
    assert samples[("tideline_records_behind", search_orders)] == 40
    assert samples[("tideline_dead_letters", search_orders)] == 1
    assert samples[("tideline_newest_applied_age_seconds", search_orders)] == 90
    assert samples[("tideline_oldest_unapplied_age_seconds", search_orders)] == 85
    # Caught up: nothing waits, so the oldest unapplied change is 0 s old.
    assert samples[("tideline_oldest_unapplied_age_seconds", (("sink", "cache"), ("table", "orders")))] == 0
    assert samples[("tideline_query_state", (("sink", "search"), ("state", "paused")))] == 1
    # The nested views' follow-up query: search's only; no figure for a sink without one.
    assert samples[("tideline_follow_up_records_behind", (("sink", "search"),))] == 7
    assert ("tideline_follow_up_records_behind", (("sink", "cache"),)) not in samples
    assert samples[("tideline_query_state", (("sink", "search"), ("state", "running")))] == 0
    assert samples[("tideline_replication_slot_lag_bytes", (("slot", "tideline"),))] == 4096
    assert samples[("tideline_replication_slot_active", (("slot", "tideline"),))] == 1
    assert samples[("tideline_connector_state", (("connector", "tideline-postgres"), ("state", "RUNNING")))] == 1
    assert samples[("tideline_status_problems", ())] == 1


def test_prometheus_text_says_the_connector_is_unreachable_and_leaves_out_an_absent_slot():
    samples = _samples(metrics.render(_status(connector_state="unreachable", slot_active=None)))
    assert samples[("tideline_connector_state", (("connector", "tideline-postgres"), ("state", "unreachable")))] == 1
    assert samples[("tideline_connector_state", (("connector", "tideline-postgres"), ("state", "RUNNING")))] == 0
    assert not any(name.startswith("tideline_replication_slot") for name, _ in samples)


def test_spans_read_just_before_and_from_each_partitions_position():
    ends = {0: 100, 1: 5, 2: 0}
    committed = {0: 90, 1: 5}
    assert sorted(spans("t", committed, ends)) == [("t", 0, 82, 90), ("t", 0, 90, 98), ("t", 1, 0, 5)]


def test_ages_read_well_in_a_table():
    assert [format_age(s) for s in (None, 0.84, 42.7, 185, 7_650)] == ["-", "0.8s", "42s", "3m05s", "2h07m"]


def test_the_pause_file_round_trips_and_a_broken_one_pauses_nothing(tmp_path):
    path = tmp_path / "jobs" / "paused.json"
    assert read_paused(path) == frozenset()
    write_paused(path, {"search"})
    assert read_paused(path) == {"search"}
    path.write_text("{not json")
    assert read_paused(path) == frozenset()


def test_figures_kafka_could_not_give_are_unknown_not_zero():
    unknown = SinkFigures("cache", "running", None,
                          (_table("orders", 0, None, None), TableFigures("x", "t.x", None, None, None, None)))
    assert unknown.records_behind is None and unknown.dead_letters is None
    status = Status(NOW, None, _status().source, (unknown,), ("cannot read Kafka",))
    assert to_json(status)["sinks"][0]["records_behind"] is None
    samples = _samples(metrics.render(status))
    assert ("tideline_records_behind", (("sink", "cache"), ("table", "x"))) not in samples
    assert samples[("tideline_records_behind", (("sink", "cache"), ("table", "orders")))] == 0
