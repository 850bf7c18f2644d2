"""The benchmark's pure parts: percentiles, the load pacer, result folders and JSON, plots from a result."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bench import core, freshness, measure, plots, report, snapshot, throughput
from services.bench.cli import parse_rates
from services.demo.load import LoadReport, Pacer, workers_for


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
    pacer = Pacer(rate=4, start=100.0, ends_at=101.0)
    assert [pacer.take() for _ in range(5)] == [100.0, 100.25, 100.5, 100.75, None]
    assert pacer.offered == 4


def test_pacer_hands_each_slot_to_exactly_one_thread():
    pacer = Pacer(rate=1000, start=0.0, ends_at=10.0)
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


def test_workers_grow_with_the_rate_within_bounds():
    assert workers_for(1) == 1
    assert workers_for(400) == 10
    assert workers_for(100_000) == 16


def test_rates_parse_or_fail_with_a_fix():
    assert parse_rates("100, 1000") == [100.0, 1000.0]
    with pytest.raises(core.BenchError, match="--rates 100,1000"):
        parse_rates("fast")
    with pytest.raises(core.BenchError, match="positive"):
        parse_rates("0")


# ---- snapshot progress ----


def test_completion_finds_when_each_column_reached_all_rows_and_its_peak_rate():
    series = [[t, min(100 * t, 1000), min(50 * t, 1000)] for t in range(0, 31)]
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
    day = datetime(2026, 11, 22, tzinfo=timezone.utc)
    assert core.result_dir(tmp_path, "freshness", day) == tmp_path / "2026-11-22-freshness"


def test_result_json_round_trips(tmp_path):
    result = {"scenario": "x", "results": {"p50": 0.5, "when": datetime(2026, 1, 1)}}
    core.write_result(tmp_path / "out", result)
    assert core.read_result(tmp_path / "out") == {"scenario": "x", "results": {"p50": 0.5, "when": "2026-01-01 00:00:00"}}


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


COMPONENTS = {"postgres": [[0, 10.0, 100.0], [1, 50.0, 120.0]], "jobs": [[0, 90.0, 900.0], [1, 120.0, 950.0]]}


def test_each_scenario_plots_pngs_from_its_json_result(tmp_path):
    delays = {"search": [[1.0, 1.2], [2.0, 0.9]], "cache": [[1.0, 0.5]], "warehouse": []}
    results = {
        freshness: {"phases": [{"label": "100/s", "delays": delays}, {"label": "1000/s", "delays": delays}]},
        snapshot: {"rows": 100, "products_written": 90, "progress_columns": ["seconds", "captured", "search"],
                   "progress": [[0, 0, 0], [2, 100, 50], [4, 100, 100]]},
        throughput: {"steps": [
            {"captured_per_s": 100.0, "applied_per_s": {"search": 100.0, "cache": 100.0, "warehouse": 90.0}},
            {"captured_per_s": 400.0, "applied_per_s": {"search": 380.0, "cache": 400.0, "warehouse": 150.0}},
        ]},
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
        }]},
        "components": {"jobs": {"cpu_mean_percent": 80.0, "cpu_peak_percent": 150.0, "rss_peak_mb": 2000.0}},
        "verify": {"clean": True, "seconds": 30.0, "views": [{"table": "customers", "sink": "search", "divergences": {}}]},
    }
    text = report.markdown(result)
    assert "| machine | 2 cores (Xeon), 23.5 GiB" in text
    assert "before 3.0, during 5.5–7.25, after 4.0" in text
    assert "java (wt-history)" in text
    assert "| 100.0 | 99.5 | 180.0 | search | 3 | 1.5 | 2.0 | 2.1 | 2.2 | 0 |" in text
    assert "| jobs | 80.0 | 150.0 | 2000.0 |" in text
    assert "tide verify: clean (1 views" in text


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
