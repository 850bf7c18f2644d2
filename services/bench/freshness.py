"""Scenario `freshness`: the demo workload at fixed rates; per sink, commit → readable delay.

Each rate runs for `duration` seconds while marker rows are committed twice a
second and read back from Elasticsearch, Redis and Delta by the benchmark
itself (services/bench/probes.py). After the last rate the markers stop and the
benchmark waits for every sink to show them all, then verifies every view.
"""

from __future__ import annotations

import time
from pathlib import Path

from services.bench import measure, plots
from services.bench.baseline import DecodingCeiling, row_changes
from services.bench.core import Bench
from services.bench.probes import POLL_S, FreshnessProbe, delay_values, sink_finders

NAME = "freshness"
DEFAULTS = {"rates": [100.0, 1000.0], "duration_s": 120.0, "seed": 1, "drain_timeout_s": 480.0}
MARKER_INTERVAL_S = 0.5


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up()
    bench.seed_demo()
    bench.capture_and_apply()
    snapshot_s = bench.wait_caught_up(300)
    bench.say(f"initial snapshot applied by every sink ({snapshot_s}s after the jobs started)")

    ceiling = DecodingCeiling(bench)
    ceiling.create()
    probe = FreshnessProbe(bench.conninfo(), sink_finders(bench.settings, bench.pipeline), bench.now, MARKER_INTERVAL_S)
    probe.start()
    phases, lag_series = [], []
    try:
        for rate in options["rates"]:
            phases.append(_phase(bench, probe, rate, options, lag_series))
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
        limit = decoding["pgoutput"]["row_changes_per_s"]
        phase["of_decoding_ceiling"] = round(phase["source_row_changes_per_s"] / limit, 4) if limit else None
    return {
        "snapshot_catch_up_s": snapshot_s,
        "marker_interval_s": MARKER_INTERVAL_S,
        "poll_interval_s": POLL_S,
        "drained": drained,
        "ceiling": decoding,
        "probe_errors": probe.errors[:20],
        "phases": phases,
        "records_behind": lag_series,
    }


def _phase(bench: Bench, probe: FreshnessProbe, rate: float, options: dict, lag_series: list) -> dict:
    bench.say(f"rate {rate:g} operations/s for {options['duration_s']:.0f}s")
    began, changes = bench.now(), row_changes(bench)
    report = bench.run_load(rate, options["duration_s"], lambda: lag_series.append([bench.now(), *bench.behind().values()]))
    ended = bench.now()
    bench.say(f"  achieved {report.achieved_rate:.1f} operations/s on {report.workers} connections")
    return {
        "label": f"{rate:g}/s asked, {report.achieved_rate:.0f}/s run",
        "rate": rate,
        "from_s": began,
        "to_s": ended,
        "load": report.as_dict(),
        "source_row_changes_per_s": round((row_changes(bench) - changes) / (ended - began), 1),
        "components": bench.sampler.summary(began, ended) if bench.sampler else {},
    }


def _drain(bench: Bench, probe: FreshnessProbe, timeout_s: float) -> dict:
    began = time.monotonic()
    while any(probe.pending().values()) and time.monotonic() - began < timeout_s:
        time.sleep(2)  # poll: the sinks apply at their own pace
    pending = probe.pending()
    caught_up = not any(pending.values())
    return {"all_markers_seen": caught_up, "seconds": round(time.monotonic() - began, 1), "pending": pending}


def plot(result: dict, out_dir: Path) -> list[Path]:
    data = result["results"]
    return [
        plots.delays(data["phases"], out_dir / "freshness-delays.png", "Commit → readable delay per sink"),
        plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component"),
    ]
