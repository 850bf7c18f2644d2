"""The benchmark's pure parts: percentiles, the load pacer, result folders and JSON, plots from a result."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bench import baseline, core, drain, freshness, measure, plots, probes, report, runs, snapshot, throughput
from services.bench.cli import parse_rates, parse_settings
from services.bench.core import running_sinks
from services.demo.load import LoadReport, Pacer, processes_for, workers_for
from services.jobs import driver
from services.settings import StackSettings
from services.versions import PROJECT_ROOT
from spark_jobs.config import load
from spark_jobs.settings import SINKS
from spark_jobs.sinks.base import build_sink
from spark_jobs.sinks.registry import REALTIME_CAPABLE, spec_of

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


# ---- result folder, JSON and plots ----


def test_result_folder_is_named_by_date_and_scenario(tmp_path):
    day = datetime(2026, 11, 22, tzinfo=UTC)
    assert runs.result_dir(tmp_path, "freshness", day) == tmp_path / "2026-11-22-freshness"


def test_result_json_round_trips(tmp_path):
    result = {"scenario": "x", "results": {"p50": 0.5, "when": datetime(2026, 1, 1)}}
    runs.write_result(tmp_path / "out", result)
    assert runs.read_result(tmp_path / "out") \
        == {"scenario": "x", "results": {"p50": 0.5, "when": "2026-01-01 00:00:00"}}


def test_raw_samples_go_to_samples_json_and_come_back_while_result_json_keeps_the_summaries(tmp_path):
    result = {"scenario": "drain", "component_series": {"jobs": [[0, 90.0, 900.0]]},
              "results": {"rate": 1200.0, "apply": {"p50": 0.4, "series": [[0, 1], [1, 2]]}, "progress": [[2.1, 234]]}}
    runs.write_result(tmp_path / "out", result)
    committed = json.loads((tmp_path / "out" / "result.json").read_text())
    assert committed == {"scenario": "drain", "results": {"rate": 1200.0, "apply": {"p50": 0.4}}}
    assert runs.read_result(tmp_path / "out") == result
    assert (tmp_path / "out" / "samples.json").exists()
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/results/2026-01-01-drain/samples.json"],
                             cwd=PROJECT_ROOT, check=False)
    assert ignored.returncode == 0, "samples.json must stay out of git"


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


COMPONENTS = {"postgres": [[0, 10.0, 100.0], [1, 50.0, 120.0]], "jobs": [[0, 90.0, 900.0], [1, 120.0, 950.0]]}


STEPS = [
    {"captured_per_s": 100.0, "applied_per_s": {"search": 100.0, "cache": 100.0, "warehouse": 90.0}},
    {"captured_per_s": 400.0, "applied_per_s": {"search": 380.0, "cache": 400.0, "warehouse": 150.0}},
]


def _drain_result() -> dict:
    sinks = {"search": {"records": 1000, "applied": 1000, "seconds": 4.0, "records_per_s": 250.0},
             "cache": {"records": 1000, "applied": 1000, "seconds": 2.0, "records_per_s": 500.0},
             "warehouse": {"records": 1000, "applied": 300, "seconds": None, "records_per_s": None},
             "analytics": {"records": 400, "applied": 400, "seconds": 8.0, "records_per_s": 50.0}}
    rates = {"decoding": 10_000.0, "capture": 2_000.0, **{sink: s["records_per_s"] for sink, s in sinks.items()}}
    return {
        "backlog": {"row_changes": 800, "seconds": 1.0, "row_changes_per_s": 800.0, "achieved_rate": 470.0,
                    "workers": 32},
        "capture": {"records": 1000}, "records_per_s": rates,
        "seconds": {"decoding": 0.1, "capture": 0.5, **{sink: s["seconds"] for sink, s in sinks.items()}},
        "ratios": {"of_decoding": measure.ratios(rates, 10_000.0),
                   "of_capture": measure.ratios({sink: rates[sink] for sink in sinks}, 2_000.0)},
        "apply": {"sinks": sinks, "series_columns": ["seconds", *sinks],
                  "series": [[0, 0, 0, 0, 0], [2, 500, 1000, 100, 100], [4, 1000, 1000, 300, 200]]},
    }


def test_each_scenario_plots_pngs_from_its_json_result(tmp_path):
    delays = {"captured": [[1.0, 0.3]], "search": [[1.0, 1.2], [2.0, 0.9]], "cache": [[1.0, 0.5]], "warehouse": []}
    results = {
        freshness: {"phases": [{"label": "100/s", "delays": delays, **STEPS[0]},
                               {"label": "1000/s", "delays": delays, **STEPS[1]}]},
        snapshot: {"rows": 100, "products_written": 90, "progress_columns": ["seconds", "captured", "search"],
                   "progress": [[0, 0, 0], [2, 100, 50], [4, 100, 100]]},
        throughput: {"steps": STEPS},
        drain: _drain_result(),
    }
    for module, data in results.items():
        out = tmp_path / module.NAME
        out.mkdir()
        result = json.loads(json.dumps({"results": data, "component_series": COMPONENTS}))
        written = module.plot(result, out)
        assert written and all(_is_png(path) for path in written), module.NAME


def test_cdf_points_rise_to_one():
    xs, ys = plots.cdf_points([3.0, 1.0, 2.0])
    assert xs == [1.0, 2.0, 3.0] and ys == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_summary_markdown_describes_the_machine_its_load_the_numbers_and_verify():
    result = {
        "scenario": "freshness", "started_at": "2026-11-22T12:00:00+00:00", "wall_s": 600.0,
        "machine": {"cores": 2, "cpu_model": "Xeon", "memory_gib": 23.5, "kernel": "6.1", "python": "3.11.7"},
        "versions": {"postgresql": "15"}, "knobs": {"job_trigger_interval": "2 seconds"},
        "load_before": {"loadavg": [3.0, 2.0, 1.0]}, "load_after": [4.0, 3.0, 2.0],
        "load_during": [[10.0, 5.5, 4.0, 3.0], [20.0, 7.25, 5.0, 3.0]],
        "other_processes_during": [{"at": 15.0, "busiest": [
            {"pid": 9, "cpu_percent": 88.0, "command": "/usr/bin/java -cp /work/wt-history/.venv/x"}]}],
        "results": {"phases": [{
            "label": "100/s", "rate": 100.0, "load": {"achieved_rate": 99.5}, "source_row_changes_per_s": 180.0,
            "delay_s": {"search": {"count": 3, "p50": 1.5, "p95": 2.0, "p99": 2.1, "max": 2.2}},
            "markers_never_seen": {"search": 0}, "components": {},
            "captured_per_s": 200.0, "applied_per_s": {"search": 190.0}, "applied_of_captured": {"search": 0.95},
        }]},
        "components": {"jobs": {"cpu_mean_percent": 80.0, "cpu_peak_percent": 150.0, "rss_peak_mb": 2000.0}},
        "verify": {"clean": True, "seconds": 30.0,
                   "views": [{"table": "customers", "sink": "search", "divergences": {}}]},
    }
    text = report.markdown(result)
    assert "| machine | 2 cores (Xeon), 23.5 GiB" in text
    assert "before 3.0, during 5.5–7.25, after 4.0" in text
    assert "java (wt-history)" in text
    assert "| 100.0 | 99.5 | 180.0 | search | 3 | 1.5 | 2.0 | 2.1 | 2.2 | 0 |" in text
    assert "| jobs | 80.0 | 150.0 | 2000.0 |" in text
    assert "| 100.0 | 200.0 | 190.0 (95.0%) |" in text  # offered vs applied, and the ratio
    assert "tide verify: clean (1 views" in text


def test_drain_summary_gives_each_stage_its_rate_and_ratios_and_says_who_did_not_catch_up():
    result = {"scenario": "drain", "started_at": "2026-11-25T12:00:00+00:00", "wall_s": 60.0,
              "machine": {"cores": 2, "cpu_model": "Xeon", "memory_gib": 23.5, "kernel": "6.1", "python": "3.11.7"},
              "versions": {}, "knobs": {}, "load_before": {"loadavg": [0.1, 0.1, 0.1]}, "load_after": [1.0, 1.0, 1.0],
              "results": _drain_result(), "verify": {"clean": False, "error": "x"}}
    text = report.markdown(result)
    assert "| capture | 1000 | 0.5 | 2000.0 | 20.0% | – |" in text
    assert "| search | 1000 | 4.0 | 250.0 | 2.5% | 12.5% |" in text
    assert "| warehouse | 1000 | not caught up | – | – | – |" in text


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
    from services.settings import StackSettings
    from spark_jobs.config import load

    settings = StackSettings()
    knobs = runs.knobs(settings, load(settings.pipeline_file), {"max.batch.size": "8192", "tasks.max": "1"})
    assert knobs["connector"]["max.batch.size"] == "8192"
    assert knobs["connector"]["tasks.max"] == "1"  # any override is recorded
    assert set(core.CAPTURE_KNOBS) <= set(knobs["connector"])


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


# ---- the sinks, from the registry ----


def test_each_sink_with_a_view_has_a_finder_for_it_and_a_poll_interval_by_its_kind():
    with_view = tuple(sink for sink in SINKS if not spec_of(sink).derived)
    finders, probed, polls = set(probes.FINDERS), probes.PROBED, probes.POLL_S
    assert finders == {spec_of(sink).view for sink in with_view}  # a new view fails here until it has a finder
    assert probed == with_view
    assert polls == {"captured": probes.CAPTURED_POLL_S, **{s: probes.POLL_BY_KIND[spec_of(s).kind] for s in probed}}


def test_each_declared_sink_is_drawn_in_a_colour_of_its_own():
    colours = [plots.SINK_COLOURS[sink] for sink in SINKS]
    assert len(set(colours)) == len(SINKS) and not set(colours) & set(plots.STAGE_COLOURS.values())


def test_the_throughput_table_has_a_column_per_declared_sink_in_registry_order():
    step = {"rate": 100.0, "load": {"achieved_rate": 99.0}, "source_row_changes_per_s": 180.0, "captured_per_s": 200.0,
            "applied_per_s": {sink: float(index) for index, sink in enumerate(SINKS)},
            "applied_of_captured": dict.fromkeys(SINKS, 0.5), "keeps_up": dict.fromkeys(SINKS, True),
            "busiest_component": "jobs"}
    lines = report.throughput_lines({"steps": [step], "summary": {}})
    assert lines[1] == report._row("rate asked", "achieved ops/s", "row changes/s", "records/s into Kafka", *SINKS,
                                   "keeps up", "busiest component")
    assert lines[3] == report._row(100.0, 99.0, 180.0, 200.0, *(float(i) for i in range(len(SINKS))),
                                   ", ".join(SINKS), "jobs")


@pytest.mark.parametrize("realtime", [[], list(REALTIME_CAPABLE)])
def test_a_run_follows_the_follow_up_topic_of_each_real_time_sink_that_has_one(realtime):
    pipeline = load()
    bench = core.Bench(StackSettings(), pipeline, {}, say=lambda _: None, sinks=SINKS)
    bench.__dict__["realtime_sinks"] = realtime  # as the driver's settings would say
    jobs = driver.job_settings(bench.settings)
    expected = {sink: topic for sink in realtime if (topic := build_sink(sink, jobs, pipeline).follow_up_topic())}
    assert bench.follow_up_topics == expected
    if realtime and pipeline.nested:  # search's nested views are rebuilt by its follow-up query
        assert expected
