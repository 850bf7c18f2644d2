"""Scenario `throughput`: step the demo workload's rate up; per sink, the highest rate applied without lag growing.

Each step runs the workload at one rate for `duration` seconds and measures, from
the real systems: row changes PostgreSQL committed (its statistics counters),
records that reached the topics (Kafka end offsets), records each sink committed
(its checkpoint), each sink's lag at the start and end of the step, and CPU per
component. A sink keeps up with a step when its lag grew by less than 20 s worth
of the step's input (a micro-batch plus a Delta MERGE). Stepping stops when no
sink keeps up or the workload cannot reach 80% of the asked rate. The decoding
ceiling (baseline.py) is measured in the same run; each step reports every sink's
applied rate as a fraction of the rate into Kafka, and the highest rate each sink
sustained as a fraction of the ceiling. Before verify, the wait for the sinks to
catch up scales with what they still have to apply, at the rates they showed.
"""

from __future__ import annotations

from pathlib import Path

from services.bench import plots
from services.bench.baseline import DecodingCeiling
from services.bench.core import Bench
from services.bench.measure import ratios

NAME = "throughput"
# Up to the 5,000 row changes/s the apply path must sustain (the demo mix makes 1.72 per operation).
DEFAULTS = {"rates": [500.0, 1000.0, 2000.0, 3000.0, 4000.0], "duration_s": 60.0, "seed": 1}
LAG_SLACK_S = 20.0


def run(bench: Bench) -> dict:
    options = {**DEFAULTS, **bench.options}
    bench.up()
    bench.seed_demo()
    bench.capture_and_apply()
    bench.wait_caught_up(300)
    ceiling = DecodingCeiling(bench)
    ceiling.create()
    steps = []
    for rate in options["rates"]:
        step = _step(bench, rate, options)
        steps.append(step)
        bench.say(f"  offered {step['captured_per_s']:.0f} records/s; applied "
                  + ", ".join(f"{s} {step['applied_per_s'][s]:.0f}" for s in bench.sinks)
                  + "; keeps up: " + (", ".join(s for s in bench.sinks if step["keeps_up"][s]) or "none"))
        if not any(step["keeps_up"].values()) or step["load"]["achieved_rate"] < 0.8 * rate:
            break
    bench.say("draining the decoding-ceiling slots with pg_recvlogical")
    drained = ceiling.drain()
    return {"steps": steps, "ceiling": drained, "summary": summarise(steps, drained)}


def _step(bench: Bench, rate: float, options: dict) -> dict:
    bench.say(f"rate {rate:g} operations/s for {options['duration_s']:.0f}s")
    began, start, behind = bench.now(), bench.progress(), bench.behind()
    report = bench.run_load(rate, options["duration_s"])
    ended, end, behind_end = bench.now(), bench.progress(), bench.behind()
    seconds = ended - began
    captured_per_s = (end["captured"] - start["captured"]) / seconds
    applied = {sink: round((end[sink] - start[sink]) / seconds, 1) for sink in bench.sinks}
    cpu = bench.components_between(began, ended)
    return {
        "rate": rate,
        "from_s": began,
        "to_s": ended,
        "load": report.as_dict(),
        "source_row_changes_per_s": round(report.row_changes_per_s, 1),
        "captured_per_s": round(captured_per_s, 1),
        "applied_per_s": applied,
        "applied_of_captured": ratios(applied, captured_per_s),
        "behind_start": behind,
        "behind_end": behind_end,
        "keeps_up": {sink: behind_end[sink] - behind[sink] <= LAG_SLACK_S * captured_per_s for sink in bench.sinks},
        "components": cpu,
        "busiest_component": max(cpu, key=lambda name: cpu[name]["cpu_mean_percent"]) if cpu else None,
    }


def check(bench: Bench, results: dict) -> dict:
    """`tide verify`, after a catch-up wait sized by each sink's backlog at the best rate it showed."""
    return bench.verify(rates={sink: max(step["applied_per_s"][sink] for step in results["steps"])
                               for sink in bench.sinks})


def summarise(steps: list[dict], ceiling: dict) -> dict:
    """Per sink: the highest step it kept up with, in row changes/s and as a fraction of the ceiling."""
    limit = ceiling["pgoutput"]["row_changes_per_s"]
    summary = {}
    for sink in steps[0]["keeps_up"] if steps else ():
        kept = [step for step in steps if step["keeps_up"][sink]]
        best = max(kept, key=lambda step: step["source_row_changes_per_s"]) if kept else None
        summary[sink] = {
            "highest_sustained_row_changes_per_s": best["source_row_changes_per_s"] if best else None,
            "highest_sustained_records_per_s": best["captured_per_s"] if best else None,
            "of_decoding_ceiling": round(best["source_row_changes_per_s"] / limit, 4) if best and limit else None,
        }
    return summary


def plot(result: dict, out_dir: Path) -> list[Path]:
    return [
        plots.offered_vs_applied(result["results"]["steps"], out_dir / "throughput-offered-vs-applied.png",
                                 "Rate offered vs rate applied per sink"),
        plots.components(result["component_series"], out_dir / "components.png", "CPU and memory per component"),
    ]
