"""The benchmark's pure parts: percentiles, /proc sampling, the load pacer, snapshot progress, rates and knobs."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bench import baseline, core, measure, probes, runs, snapshot, throughput
from services.bench.cli import parse_rates, parse_settings
from services.bench.core import running_sinks
from services.bench.report import warm_up_line
from services.demo.load import LoadReport, Pacer, processes_for, workers_for
from services.settings import StackSettings
from spark_jobs.model.config import load
from spark_jobs.model.settings import SINKS

# ---- percentiles ----


def test_percentile_interpolates_between_closest_ranks():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert measure.percentile(values, 50) == 5.5
    assert measure.percentile(values, 0) == 1
    assert measure.percentile(values, 100) == 10
    assert measure.percentile(values, 95) == pytest.approx(9.55)


def test_percentile_of_nothing_is_none_and_q_out_of_range_is_an_error():
    assert measure.percentile([], 50) is None
    with pytest.raises(ValueError):
        measure.percentile([1], 101)


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1), st.floats(min_value=0, max_value=100))
def test_percentile_lies_within_the_values_and_grows_with_q(values, q):
    value = measure.percentile(values, q)
    assert min(values) <= value <= max(values)
    assert measure.percentile(values, min(100, q + 1)) >= value - 1e-9


def test_distribution_reports_count_percentiles_and_max():
    summary = measure.distribution([0.1, 0.2, 0.3, 5.0])
    assert summary == {"count": 4, "p50": 0.25, "p95": 4.295, "p99": 4.859, "max": 5.0}
    assert measure.distribution([]) == {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}


# ---- /proc sampling ----


def test_process_tree_finds_descendants():
    tree = {1: [2, 3], 2: [4], 5: [6]}
    assert sorted(measure.process_tree(1, tree)) == [1, 2, 3, 4]


def test_process_tree_leaves_out_other_components_subtrees():
    tree = {1: [2, 3], 2: [4]}
    assert sorted(measure.process_tree(1, tree, stop_at=[1, 2])) == [1, 3]


def test_this_process_uses_cpu_and_memory_as_proc_reports():
    cpu_before, rss = measure.cpu_and_rss([os.getpid()])
    sum(i * i for i in range(2_000_000))  # burn some CPU
    cpu_after, _ = measure.cpu_and_rss([os.getpid()])
    assert cpu_after > cpu_before
    assert rss > 10 * 2**20


def test_sampler_summarises_each_component():
    sampler = measure.ProcessSampler(lambda: {"me": os.getpid()}, interval_s=0.05)
    sampler.sample()
    sum(i * i for i in range(1_000_000))
    sampler.sample()
    summary = sampler.summary()["me"]
    assert summary["rss_peak_mb"] > 10
    assert summary["cpu_peak_percent"] > 0
    assert sampler.series()["me"][0][0] >= 0


# ---- rate control ----


def test_pacer_spaces_slots_by_one_over_the_rate_and_stops_at_the_end():
    pacer = Pacer(rate=4, start=100.0, ends_at=101.0, clock=lambda: 100.0)
    assert [pacer.take() for _ in range(5)] == [100.0, 100.25, 100.5, 100.75, None]
    assert pacer.offered == 4


def test_a_late_pacer_stops_at_the_end_instead_of_running_every_slot():
    now = [100.0]
    pacer = Pacer(rate=1000, start=100.0, ends_at=101.0, clock=lambda: now[0])
    assert pacer.take() == 100.0
    now[0] = 101.0  # the machine could not keep up: 998 slots are still due
    assert pacer.take() is None
    assert pacer.offered == 1


def test_pacer_hands_each_slot_to_exactly_one_thread():
    pacer = Pacer(rate=1000, start=0.0, ends_at=10.0, clock=lambda: 0.0)
    taken: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        while (due := pacer.take()) is not None:
            with lock:
                taken.append(due)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == [i / 1000 for i in range(10_000)]


def test_pacer_rejects_a_rate_that_is_not_positive():
    with pytest.raises(ValueError):
        Pacer(rate=0, start=0, ends_at=1)


def test_achieved_rate_counts_every_operation_run():
    report = LoadReport(rate=100, workers=2, seconds=10, done=700, idle=200, conflicts=100)
    assert report.achieved_rate == 100
    assert report.as_dict()["operations"] == 1000


def test_workers_grow_with_the_rate_within_bounds_and_spread_over_processes_by_eight():
    assert workers_for(1) == 1
    assert workers_for(400) == 8
    assert workers_for(100_000) == 32
    assert [processes_for(n) for n in (1, 8, 9, 32)] == [1, 1, 2, 4]


def test_reports_of_several_processes_add_up_and_give_row_changes_per_second():
    total = LoadReport(rate=100, workers=4, processes=2, seconds=10)
    total.add(LoadReport(rate=50, workers=2, done=400, idle=50, by_operation={"place order": 400, "nothing to do": 50}))
    total.add(LoadReport(rate=50, workers=2, done=450, conflicts=1, by_operation={"place order": 450, "conflict": 1},
                         errors=["worker 3: boom"]))
    total.row_changes = 1700
    summary = total.as_dict()
    assert (summary["operations"], summary["changed"], summary["conflicts"]) == (901, 850, 1)
    assert summary["by_operation"] == {"conflict": 1, "nothing to do": 50, "place order": 850}
    assert summary["row_changes_per_s"] == 170.0 and summary["errors"] == ["worker 3: boom"]
    assert LoadReport(rate=1, workers=1, seconds=5).row_changes_per_s is None  # not counted yet


def test_rates_parse_or_fail_with_a_fix():
    assert parse_rates("100, 1000") == [100.0, 1000.0]
    with pytest.raises(core.BenchError, match="--rates 100,1000"):
        parse_rates("fast")
    with pytest.raises(core.BenchError, match="positive"):
        parse_rates("0")


# ---- snapshot progress ----


def test_completion_finds_when_each_column_reached_all_rows_and_its_peak_rate():
    series = [[t, min(100 * t, 1000), min(50 * t, 1000)] for t in range(31)]
    done = snapshot.completion(series, ["captured", "search"], {"captured": 1000, "search": 1000})
    assert done["captured"] == {"rows": 1000, "seconds_to_all_rows": 10, "rows_per_s": 100.0, "peak_rows_per_s": 100.0}
    assert done["search"]["seconds_to_all_rows"] == 20
    assert done["search"]["peak_rows_per_s"] == 50.0


def test_completion_of_a_column_that_never_got_there_is_none():
    done = snapshot.completion([[0, 0], [2, 5]], ["warehouse"], {"warehouse": 10})
    assert done["warehouse"]["seconds_to_all_rows"] is None and done["warehouse"]["rows_per_s"] is None


# ---- throughput summary ----


def _step(rate, changes, keeps):
    return {"source_row_changes_per_s": changes, "captured_per_s": changes * 2,
            "keeps_up": {"search": keeps, "cache": True, "warehouse": False, "analytics": False}, "rate": rate}


def test_summary_takes_the_highest_step_each_sink_kept_up_with_against_the_ceiling():
    steps = [_step(50, 100, True), _step(100, 200, True), _step(200, 400, False)]
    summary = throughput.summarise(steps, {"pgoutput": {"row_changes_per_s": 1000.0}})
    assert summary["search"] == {"highest_sustained_row_changes_per_s": 200, "highest_sustained_records_per_s": 400,
                                 "of_decoding_ceiling": 0.2}
    assert summary["cache"]["highest_sustained_row_changes_per_s"] == 400
    assert summary["warehouse"]["highest_sustained_row_changes_per_s"] is None


def test_rates_become_fractions_of_a_base_and_unknowns_stay_unknown():
    assert measure.ratios({"search": 250.0, "warehouse": None, "cache": 0.0}, 2000.0) == {
        "search": 0.125, "warehouse": None, "cache": None}
    assert measure.ratios({"search": 250.0}, None) == {"search": None}


def test_the_catch_up_wait_scales_with_the_slowest_backlog_within_bounds():
    assert core.catch_up_budget({"search": 0, "cache": 0}, {}) == 300  # nothing behind: the floor
    # 185,779 records at the 150/s measured, twice over: about 41 min, where the old fixed 300 s ran out
    assert core.catch_up_budget({"warehouse": 185_779, "search": 10}, {"warehouse": 150.0}) == 2477.1
    assert core.catch_up_budget({"warehouse": 1000}, {}) == 300  # unmeasured: 100/s assumed
    assert core.catch_up_budget({"warehouse": 10**9}, {"warehouse": 1.0}) == 4 * 3600  # capped


def test_test_decoding_lines_count_by_kind_and_become_debezium_records():
    lines = [
        "BEGIN 1",
        "table public.orders: INSERT: id[bigint]:1 status[order_status]:'pending'",
        "table public.orders: UPDATE: id[bigint]:1 status[order_status]:'paid'",
        "table public.order_items: UPDATE: old-key: order_id[bigint]:1 line_no[integer]:1 "
        "new-tuple: order_id[bigint]:1",
        "table public.customers: DELETE: id[bigint]:7",
        "table public.tideline_heartbeat: UPDATE: id[integer]:1 beat_at[timestamp with time zone]:'2026'",
        "COMMIT 1",
    ]
    counts = baseline.count_changes(lines, {"public.orders", "public.order_items", "public.customers"})
    assert counts == {("public.orders", "INSERT"): 1, ("public.orders", "UPDATE"): 1,
                      ("public.order_items", "KEY UPDATE"): 1, ("public.customers", "DELETE"): 1}
    # insert 1, update 1, key change 3 (delete, tombstone, create), delete 2 (delete, tombstone)
    assert baseline.debezium_records(counts) == 7
    assert sum(baseline.count_changes(lines).values()) == 5


def test_connector_settings_parse_or_fail_with_a_fix():
    assert parse_settings(["max.batch.size=8192", " poll.interval.ms = 50 "]) == {
        "max.batch.size": "8192", "poll.interval.ms": "50"}
    with pytest.raises(core.BenchError, match="KEY=VALUE"):
        parse_settings(["max.batch.size"])


def test_knobs_record_the_capture_settings_with_the_runs_overrides():

    settings = StackSettings()
    knobs = runs.knobs(settings, load(settings.pipeline_file), {"max.batch.size": "8192", "tasks.max": "1"})
    assert knobs["connector"]["max.batch.size"] == "8192"
    assert knobs["connector"]["tasks.max"] == "1"  # any override is recorded
    assert set(core.CAPTURE_KNOBS) <= set(knobs["connector"])


def test_a_run_records_whether_the_driver_had_its_class_archive(tmp_path):
    from services.stack import jars
    from spark_jobs.runtime import class_archive

    settings = StackSettings(lib_dir=tmp_path)
    jar_dir = jars.bundle_dir(settings, "spark")
    assert runs.class_archive_state(settings).startswith("none")
    jar_dir.mkdir(parents=True)
    class_archive.archive_of(jar_dir).write_bytes(b"")
    assert runs.class_archive_state(settings) == "in use"


def test_knobs_record_the_drivers_jvm_options(monkeypatch):
    settings = StackSettings()
    monkeypatch.setenv("TIDE_JOB_JVM_OPTIONS", "-XX:TieredStopAtLevel=1")
    assert runs.knobs(settings, load(settings.pipeline_file))["job_jvm_options"] == "-XX:TieredStopAtLevel=1"
    monkeypatch.setenv("TIDE_JOB_JVM_OPTIONS", "")
    assert runs.knobs(settings, load(settings.pipeline_file))["job_jvm_options"] == "none"


def test_knobs_record_whether_the_delta_queries_ran_in_a_niced_driver_of_their_own(monkeypatch):
    settings = StackSettings()
    monkeypatch.delenv("TIDE_JOB_DELTA_DRIVER_NICE", raising=False)
    assert runs.knobs(settings, load(settings.pipeline_file))["job_delta_driver_nice"] == "one driver"
    monkeypatch.setenv("TIDE_JOB_DELTA_DRIVER_NICE", "10")
    assert runs.knobs(settings, load(settings.pipeline_file))["job_delta_driver_nice"] == 10


def test_a_change_records_key_gives_its_id_with_or_without_connects_schema():
    assert probes.record_id(b'{"schema": {"type": "struct"}, "payload": {"id": 42}}') == 42
    assert probes.record_id(b'{"id": 43}') == 43
    assert probes.record_id(b'{"truncate": "customers"}') is None
    assert probes.record_id(None) is None and probes.record_id(b"not json") is None


def test_completion_measures_each_column_against_its_own_goal():
    # analytics reads fewer tables than the other sinks: it is done when it holds its own tables' rows
    series = [[0, 0, 0], [2, 100, 40], [4, 200, 40]]
    done = snapshot.completion(series, ["captured", "analytics"], {"captured": 200, "analytics": 40})
    assert done["captured"]["seconds_to_all_rows"] == 4
    assert done["analytics"] == {"rows": 40, "seconds_to_all_rows": 2, "rows_per_s": 20.0, "peak_rows_per_s": None}


def test_a_drop_in_a_components_cpu_total_counts_as_idle_not_negative(monkeypatch):
    # a process leaving the tree unreaped takes its CPU seconds with it: the tree's total falls
    totals = iter([(100.0, 0), (101.0, 0), (20.0, 0), (20.5, 0)])
    monkeypatch.setattr(measure, "cpu_and_rss", lambda pids: next(totals))
    sampler = measure.ProcessSampler(lambda: {"jobs": os.getpid()})
    for _ in range(4):
        sampler.sample()  # monotonic time moves on between calls: every interval is positive
    busy = [sample.cpu_percent for sample in sampler.samples["jobs"]]
    assert busy[0] == 0.0 and busy[1] > 0 and busy[2] == 0.0 and busy[3] > 0


def test_a_run_measures_the_sinks_the_driver_runs_in_pipeline_order(monkeypatch):
    monkeypatch.setenv("TIDE_JOB_SINKS", '["cache", "search"]')
    assert running_sinks() == ("search", "cache")
    monkeypatch.delenv("TIDE_JOB_SINKS")
    assert running_sinks() == SINKS


def test_a_freshness_summary_says_what_ran_before_its_first_measured_phase():
    assert warm_up_line({"rate": 30.0, "seconds": 180.0, "catch_up_s": 12.5}) == (
        "Warm-up, not measured: 30 operations/s for 180 s, then every sink caught up in 12.5 s.")
    cold = "Measured from the cold start: no warm-up."
    assert warm_up_line({"rate": 30.0, "seconds": 0.0, "catch_up_s": 0.0}) == cold
    assert warm_up_line(None) == cold  # results written before the warm-up existed
