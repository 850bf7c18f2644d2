"""Scenario `freshness`: the demo workload at fixed rates; per sink, commit → readable delay.

First the load runs at the first rate for `warm_up` seconds and every sink catches up, unmeasured:
the JVMs (the jobs', Elasticsearch's, Kafka's, Connect's) start moments before, and for their first
minutes their JIT compilers take up to half their CPU (docs/benchmarks.md, "freshness — 2026-12-05
08:29-09:23"), which a pipeline that runs for days pays once. `--warm-up 0` measures from the cold start.
Then each rate runs for `duration` seconds while marker rows are committed twice a
second and read back from Elasticsearch, Redis and Delta by the benchmark
itself (services/bench/probes.py), and from the marker table's change topic
(`captured`: the capture stage's own delay). Per rate it also records the rate
offered (into Kafka) and applied by each sink, and their ratio. After the last
rate the markers stop and the benchmark waits for every sink to show them all,
then verifies every view. With `capture_only` no Spark job runs: only the
capture stage's delay is measured (how Debezium's poll interval is measured).
"""

from __future__ import annotations

import time
from pathlib import Path

from services.bench import measure, plots
from services.bench.baseline import DecodingCeiling
from services.bench.core import CAPTURE_SERVICES, Bench
from services.bench.measure import ratios
from services.bench.probes import POLL_S, Finder, FreshnessProbe, capture_finder, delay_values, sink_finders
from spark_jobs.model.settings import SinkName

NAME = "freshness"
# 580 operations/s of the demo mix are about 1,000 row changes/s (1.72 per operation), the target rate.
DEFAULTS = {"rates": [100.0, 580.0], "duration_s": 120.0, "seed": 1, "drain_timeout_s": 480.0, "capture_only": False,
            "warm_up_s": 180.0}
MARKER_INTERVAL_S = 0.5


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    capture_only = options["capture_only"]
    bench.up(CAPTURE_SERVICES if capture_only else None)
    bench.seed_demo()
    if capture_only:
        bench.capture()
        snapshot_s = None
    else:
        bench.capture_and_apply()
        snapshot_s = bench.wait_caught_up(300)
        bench.say(f"initial snapshot applied by every sink ({snapshot_s}s after the jobs started)")
    # Before the markers (the wait for every sink to catch up needs the writes to stop; the markers do not)
    # and the ceiling's slots (which hold the measured phases' changes only, as before the warm-up existed).
    warm_up = _warm_up(bench, options, capture_only)
    ceiling = DecodingCeiling(bench)
    ceiling.create()
    finders: dict[str, Finder] = {
        "captured": capture_finder(bench.settings, bench.pipeline),
        **({} if capture_only else sink_finders(bench.settings, bench.pipeline, bench.sinks))}
    probe = FreshnessProbe(bench.conninfo(), finders, bench.now, MARKER_INTERVAL_S)
    probe.start()
    phases: list[dict] = []
    lag_series: list[list[float]] = []
    try:
        for rate in options["rates"]:
            phases.append(_phase(bench, probe, rate, options, lag_series, () if capture_only else bench.sinks))
        probe.stop_writing()
        bench.say("load stopped; waiting for every sink to show every marker")
        drained = _drain(bench, probe, options["drain_timeout_s"])
    finally:
        probe.stop()
    bench.say("draining the decoding-ceiling slots with pg_recvlogical")
    decoding = ceiling.drain()
    for phase in phases:
        points = probe.delays(phase["from_s"], phase["to_s"])
        phase["delays"] = points
        phase["delay_s"] = {sink: measure.distribution(delay_values(p)) for sink, p in points.items()}
        phase["markers_never_seen"] = probe.unseen(phase["from_s"], phase["to_s"])
        phase["of_decoding_ceiling"] = ratios({"source": phase["source_row_changes_per_s"]},
                                              decoding["pgoutput"]["row_changes_per_s"])["source"]
    return {
        "capture_only": capture_only,
        "snapshot_catch_up_s": snapshot_s,
        "warm_up": warm_up,
        "marker_interval_s": MARKER_INTERVAL_S,
        "poll_interval_s": POLL_S,
        "drained": drained,
        "ceiling": decoding,
        "probe_errors": probe.errors[:20],
        "phases": phases,
        "records_behind": lag_series,
    }


def _warm_up(bench: Bench, options: dict, capture_only: bool) -> dict:
    """The first rate for `warm_up_s` seconds, then every sink caught up; not measured (module docstring)."""
    seconds, rate = options["warm_up_s"], options["rates"][0]
    if seconds <= 0:
        return {"rate": rate, "seconds": 0.0, "catch_up_s": 0.0}
    bench.say(f"warm-up: rate {rate:g} operations/s for {seconds:.0f}s, not measured")
    bench.run_load(rate, seconds)
    catch_up_s = 0.0
    if not capture_only:
        catch_up_s = bench.wait_caught_up(options["drain_timeout_s"])
        bench.say(f"  every sink caught up {catch_up_s}s after the warm-up")
    return {"rate": rate, "seconds": seconds, "catch_up_s": catch_up_s}


def _phase(bench: Bench, probe: FreshnessProbe, rate: float, options: dict, lag_series: list,
           sinks: tuple[SinkName, ...]) -> dict:
    bench.say(f"rate {rate:g} operations/s for {options['duration_s']:.0f}s")
    began, start = bench.now(), bench.progress(sinks)
    every_5_s = (lambda: lag_series.append([bench.now(), *bench.behind().values()])) if sinks else (lambda: None)
    report = bench.run_load(rate, options["duration_s"], every_5_s)
    ended, end = bench.now(), bench.progress(sinks)
    bench.say(f"  achieved {report.achieved_rate:.1f} operations/s on {report.workers} connections")
    captured_per_s = (end["captured"] - start["captured"]) / (ended - began)
    applied = {sink: round((end[sink] - start[sink]) / (ended - began), 1) for sink in sinks}
    return {
        "label": f"{rate:g}/s asked, {report.achieved_rate:.0f}/s run",
        "rate": rate,
        "from_s": began,
        "to_s": ended,
        "load": report.as_dict(),
        "source_row_changes_per_s": round(report.row_changes_per_s, 1),
        "captured_per_s": round(captured_per_s, 1),
        "applied_per_s": applied,
        "applied_of_captured": ratios(applied, captured_per_s),
        "components": bench.components_between(began, ended),
    }


def check(bench: Bench, results: dict) -> dict:
    """Capture only: every marker reached the topic. Otherwise `tide verify`."""
    if not results["capture_only"]:
        return bench.verify(rates={sink: max(phase["applied_per_s"][sink] for phase in results["phases"])
                                   for sink in bench.sinks})
    return {"clean": results["drained"]["all_markers_seen"], "markers_pending": results["drained"]["pending"]}


def _drain(bench: Bench, probe: FreshnessProbe, timeout_s: float) -> dict:
    began = time.monotonic()
    while any(probe.pending().values()) and time.monotonic() - began < timeout_s:
        time.sleep(2)  # poll: the sinks apply at their own pace
    pending = probe.pending()
    caught_up = not any(pending.values())
    return {"all_markers_seen": caught_up, "seconds": round(time.monotonic() - began, 1), "pending": pending}


def plot(result: dict, out_dir: Path) -> list[Path]:
    data = result["results"]
    drawn = [plots.delays(data["phases"], out_dir / "freshness-delays.png", "Commit → readable delay per sink")]
    if not data.get("capture_only"):
        drawn.append(plots.offered_vs_applied(data["phases"], out_dir / "freshness-offered-vs-applied.png",
                                              "Rate offered vs rate applied per sink, per load phase"))
    return [*drawn, plots.components(result["component_series"], out_dir / "components.png",
                                     "CPU and memory per component")]
