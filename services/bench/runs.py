"""One scenario run from start to result: its clean stack, the knobs in force, the machine before,
during and after, the scenario's measurements and check, and the result folder (result.json,
samples.json, summary.md, PNG plots)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.bench import measure, report
from services.bench.core import CAPTURE_KNOBS, Bench, Say, bench_settings, running_sinks
from services.jobs import driver
from services.settings import StackSettings
from services.stack import jars
from services.versions import PROJECT_ROOT, pinned
from spark_jobs.model.config import PipelineConfig, load
from spark_jobs.runtime import class_archive

RESULTS_DIR = PROJECT_ROOT / "bench" / "results"


def knobs(settings: StackSettings, pipeline: PipelineConfig, connector: dict[str, str] | None = None) -> dict[str, Any]:
    """The tuning settings in force, so a result says what it was measured with: the jobs', the
    heaps', and the capture settings of the connector config (with the run's `--connector` overrides)."""
    from services.capture.connector.registration import render_config
    from spark_jobs.model.settings import JobSettings
    from spark_jobs.realtime import local_master

    config = render_config(settings, pipeline, connector)
    capture = {key: config.get(key, report.DEFAULT_SETTING)
               for key in [*CAPTURE_KNOBS, *sorted(set(connector or {}) - set(CAPTURE_KNOBS))]}

    jobs = driver.job_settings(settings)
    env_only = JobSettings()  # settings the driver reads straight from TIDE_JOB_* (not set by the stack)
    return {
        "job_master": local_master(jobs, pipeline),  # with a slot per partition of the real-time queries
        "job_sinks": ",".join(running_sinks()),
        "job_realtime_sinks": ",".join(jobs.realtime_sinks) or "none",
        "job_realtime_epoch": jobs.realtime_epoch,
        "job_trigger_interval": jobs.trigger_interval,
        "job_warehouse_trigger_interval": env_only.warehouse_trigger_interval,
        "job_analytics_trigger_interval": env_only.analytics_trigger_interval,
        "job_max_offsets_per_trigger": jobs.max_offsets_per_trigger,
        "job_delta_max_offsets_per_trigger": env_only.delta_max_offsets_per_trigger,
        "job_follow_up_max_offsets_per_trigger": env_only.follow_up_max_offsets_per_trigger,
        "job_driver_memory": jobs.driver_memory,
        "job_es_bulk_size": env_only.es_bulk_size,
        "job_es_refresh_ms": env_only.es_refresh_ms,
        "job_jvm_options": env_only.jvm_options or "none",  # the driver JVM's extra options (its JIT, say)
        # set: the Delta queries run in a second driver at this nice value (spark_jobs/runtime/drivers.py)
        "job_delta_driver_nice": "one driver" if env_only.delta_driver_nice is None else env_only.delta_driver_nice,
        "source_partitions": pipeline.source.partitions,
        # the cluster profile (docs/cluster.md): 0 workers is the local master above
        "spark_workers": settings.spark_workers,
        "job_executors": jobs.executors if settings.spark_workers else None,
        "kafka_brokers": settings.kafka_brokers,
        "kafka_heap": settings.kafka_heap,
        "connect_heap": settings.connect_heap,
        "elasticsearch_heap": settings.elasticsearch_heap,
        "connector": capture,
    }


def class_archive_state(settings: StackSettings) -> str:
    """Whether the jobs' driver ran with the class archive (spark_jobs/runtime/class_archive.py): it
    starts a driver some seconds sooner, and new Spark jars (a change to the writers' code) drop it."""
    in_use = class_archive.reading(jars.bundle_dir(settings, "spark"))
    return "in use" if in_use else "none (`tide stack fetch` writes it)"


def result_dir(root: Path, scenario: str, day: datetime | None = None) -> Path:
    """bench/results/<date>-<scenario>/ (a second run the same day replaces the first)."""
    return root / f"{(day or datetime.now(UTC)):%Y-%m-%d}-{scenario}"


# The raw samples behind the plots (per-second component figures and load, per-probe delays, per-batch
# and progress series): kept beside the result in samples.json, which git ignores; result.json keeps
# every summary.
RAW_SAMPLES = frozenset({"component_series", "load_during", "series", "progress", "records_behind", "delays"})


def split_samples(value: Any) -> tuple[Any, Any]:
    """(`value` without its raw samples, the raw samples at the same paths), through dicts and lists
    of dicts (a run's phases) at any depth; the samples are empty ({} or []) when there are none."""
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        parts = [split_samples(item) for item in value]
        inner = [samples for _, samples in parts]
        return [summary for summary, _ in parts], inner if any(inner) else {}
    if not isinstance(value, dict):
        return value, {}
    summary: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for key, item in value.items():
        if key in RAW_SAMPLES:
            samples[key] = item
            continue
        summary[key], inner = split_samples(item)
        if inner:
            samples[key] = inner
    return summary, samples


def _merged(summary: Any, samples: Any) -> Any:
    if isinstance(summary, list) and isinstance(samples, list):
        return [_merged(item, extra) for item, extra in zip(summary, samples, strict=True)]
    if not (isinstance(summary, dict) and isinstance(samples, dict)):
        return summary
    merged = dict(summary)
    for key, value in samples.items():
        merged[key] = _merged(merged[key], value) if key in merged else value
    return merged


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")


def write_result(out_dir: Path, result: dict[str, Any]) -> Path:
    """result.json (summaries, committed) and samples.json (the raw samples, git-ignored)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary, samples = split_samples(result)
    path = out_dir / "result.json"
    _write_json(path, summary)
    if samples:
        _write_json(out_dir / "samples.json", samples)
    return path


def read_result(out_dir: Path) -> dict[str, Any]:
    """The whole result: its summaries, with the raw samples where this machine still has them."""
    summary = json.loads((out_dir / "result.json").read_text())
    samples_file = out_dir / "samples.json"
    return _merged(summary, json.loads(samples_file.read_text())) if samples_file.exists() else summary


@contextmanager
def sampled(bench: Bench, interval_s: float = 1.0) -> Iterator[measure.ProcessSampler]:
    sampler = measure.ProcessSampler(bench.component_pids, interval_s)
    bench.sampler = sampler
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def run_scenario(scenario, settings: StackSettings, out_dir: Path, options: dict[str, Any], say: Say,
                 keep_stack: bool = False) -> dict[str, Any]:
    """Run one scenario on its own clean stack and write result.json and its plots to `out_dir`."""
    settings = bench_settings(settings)
    pipeline = load(settings.pipeline_file)
    bench = Bench(settings, pipeline, options, say)
    started_at = datetime.now(UTC)
    say("measuring the machine's load before the run")
    result: dict[str, Any] = {
        "scenario": scenario.NAME,
        "started_at": started_at.isoformat(timespec="seconds"),
        "options": options,
        "machine": measure.machine(),
        "versions": pinned().model_dump(),
        "knobs": knobs(settings, pipeline, options.get("connector")),
        "load_before": {"loadavg": measure.loadavg(), "busiest_processes": measure.busiest_processes()},
    }
    try:
        with sampled(bench) as sampler:
            result["results"] = scenario.run(bench)
            # After the run: starting the jobs may have rebuilt the Spark jars, and the archive with them.
            result["knobs"]["job_class_archive"] = class_archive_state(settings)
            # A scenario without the sinks (baseline) checks its own result instead.
            try:
                result["verify"] = (scenario.check(bench, result["results"]) if hasattr(scenario, "check")
                                    else bench.verify())
            except Exception as exc:  # noqa: BLE001 - the measurements stay a (failed) result, written below
                result["verify"] = {"clean": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            result["components"] = sampler.summary()
            result["component_series"] = sampler.series()
    finally:
        if not keep_stack:
            say("stopping the bench stack")
            bench.down()
    result["load_during"] = bench.load_during
    result["other_processes_during"] = bench.others_during
    result["load_after"] = measure.loadavg()
    result["wall_s"] = round(time.monotonic() - bench.began, 1)
    write_result(out_dir, result)
    result["plots"] = [path.name for path in scenario.plot(result, out_dir)]
    write_result(out_dir, result)
    report.write(result, out_dir)
    return result

