"""What every scenario shares: its own clean stack, the sinks' progress, the result folder, verify.

A scenario is a module with `NAME`, `run(bench) -> dict` (its measurements) and
`plot(result, out_dir) -> list[Path]` (PNG files drawn from the JSON result alone,
so plots can be redrawn from a committed result).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from services.bench import measure, report
from services.jobs import driver, lag
from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.stack.catalogue import CATALOGUE
from services.stack.service import StackError
from services.versions import PROJECT_ROOT, pinned
from spark_jobs.config import PipelineConfig, load
from spark_jobs.pipeline import tables_with_view
from spark_jobs.settings import SINKS, SinkName

T = TypeVar("T")
RESULTS_DIR = PROJECT_ROOT / "bench" / "results"
Say = Callable[[str], None]


class BenchError(StackError):
    """The benchmark cannot go on (a deadline passed, a store refused); the message says what and where."""


def poll_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 1.0) -> T:
    """The first truthy value of predicate(), polled every interval_s; BenchError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise BenchError(f"gave up after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)  # poll: the state we wait for lives in another process
    return value


def bench_settings(settings: StackSettings) -> StackSettings:
    """The bench's own stack: a `bench` folder under the state folder, so a run never touches your data."""
    return settings.model_copy(update={"state_dir": settings.state_dir / "bench"})


@dataclass
class Bench:
    """One scenario run: its stack, the pipeline, options, the CPU/RSS sampler and a clock."""

    settings: StackSettings
    pipeline: PipelineConfig
    options: dict[str, Any]
    say: Say
    sampler: measure.ProcessSampler | None = None
    began: float = field(default_factory=time.monotonic)
    load_during: list[list[float]] = field(default_factory=list)
    others_during: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        """Seconds since the scenario began (the x axis of every series)."""
        return round(time.monotonic() - self.began, 3)

    def conninfo(self) -> str:
        return postgres.conninfo(self.settings)

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(), autocommit=True)

    # ---- the stack -----------------------------------------------------------------------------

    def up(self, services: list[str] | None = None) -> None:
        """A clean stack: stop anything left in the bench folder, delete it, start the services, migrate."""
        import migrations  # SQLAlchemy and Alembic only when a bench runs

        self.down()
        process.purge(self.settings.state_dir)
        self.say(f"starting a clean stack in {self.settings.state_dir}")
        runner.up(self.settings, services, report=lambda name, state: self.say(f"  {name}: {state}"))
        migrations.upgrade(self.settings, pipeline=self.pipeline)

    def seed_demo(self) -> None:
        """A starting data set for the demo workload (larger than the default, so picks spread out)."""
        import random

        from services.demo import workload

        with self.connect() as conn:
            workload.seed(conn, random.Random(self.options.get("seed", 1)), customers=500, products=100, orders=500)

    def capture_and_apply(self) -> None:
        """Register the connector (initial snapshot, then streaming) and start the Spark jobs."""
        from services.connector import registration

        registration.apply(self.settings, self.pipeline)  # also creates every change topic first
        self.say("connector running; starting the apply jobs")
        runner.start_and_wait(self.settings, [driver.SERVICE], report=lambda name, state: self.say(f"  {name}: {state}"))

    def down(self) -> None:
        process.stop(runner.pid_file(self.settings, driver.SERVICE))
        runner.down(self.settings)

    def component_pids(self) -> dict[str, int]:
        """Root pid of each running component (the sampler adds their descendants), and this process."""
        pids = {"bench (load, probes, verify)": os.getpid()}
        for service in [*CATALOGUE.values(), driver.SERVICE]:
            if started := process.running(runner.pid_file(self.settings, service)):
                pids[service.name] = started.pid
        return pids

    # ---- the sinks -------------------------------------------------------------------------------

    def topics(self, sink: SinkName | None = None) -> list[str]:
        tables = tables_with_view(self.pipeline, sink) if sink else list(self.pipeline.tables)
        return [self.pipeline.topic(table) for table in tables]

    def progress(self) -> dict[str, int]:
        """Records in the change topics (`captured`) and, per sink, records its query has committed."""
        ends = lag.end_offsets(self.settings, self.topics())
        counts = {"captured": sum(offset for parts in ends.values() for offset in parts.values())}
        for sink in SINKS:
            committed = lag.committed_offsets(self.settings.state_dir / "checkpoints" / sink)
            mine = {topic: parts for topic, parts in ends.items() if topic in self.topics(sink)}
            counts[sink] = sum(
                min(committed.get(topic, {}).get(part, 0), end) for topic, parts in mine.items() for part, end in parts.items()
            )
        return counts

    def behind(self) -> dict[str, int]:
        """Records each sink has not yet committed, against the topics' end offsets now."""
        return {
            sink: lag.records_behind(
                lag.committed_offsets(self.settings.state_dir / "checkpoints" / sink),
                lag.end_offsets(self.settings, self.topics(sink)),
            )
            for sink in SINKS
        }

    def wait_caught_up(self, timeout_s: float) -> float:
        """Wait until every sink has committed everything in its topics as of now; returns the seconds waited."""
        began = time.monotonic()
        poll_until(lambda: not any(self.behind().values()), timeout_s, "every sink to catch up with its topics", 2.0)
        return round(time.monotonic() - began, 1)

    def record_load(self) -> None:
        self.load_during.append([self.now(), *measure.loadavg()])

    def run_load(self, rate: float, duration_s: float, every_5_s: Callable[[], None] = lambda: None):
        """The demo workload at `rate` for `duration_s`; meanwhile the load average (and `every_5_s`)
        every 5 s, and the other processes on the machine once, half-way."""
        from services.demo import load

        next_at, others_seen = [0.0], [False]

        def watch(report: load.LoadReport) -> None:
            if report.seconds >= next_at[0]:
                next_at[0] += 5
                self.record_load()
                every_5_s()
            if not others_seen[0] and report.seconds >= duration_s / 2:
                others_seen[0] = True
                self.record_others()

        return load.run(self.conninfo(), rate, duration_s, seed=self.options.get("seed", 1), on_progress=watch)

    def record_others(self) -> None:
        """The busiest processes that are not this benchmark's (other stacks on the machine), now."""
        tree = measure.children_by_parent()
        mine = [pid for root in self.component_pids().values() for pid in measure.process_tree(root, tree)]
        self.others_during.append({"at": self.now(), "busiest": measure.busiest_processes(exclude=mine)})

    # ---- correctness -----------------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        """`tide verify` over every view: a fast wrong answer is not a result."""
        from services.verify import reconcile_views

        try:
            catch_up_s: float | str = self.wait_caught_up(300)
        except BenchError as exc:
            catch_up_s = str(exc)  # verify anyway: the divergences then say what is missing
        began = time.monotonic()
        self.say("verifying every view against PostgreSQL")
        outcomes = reconcile_views(self.settings, pipeline=self.pipeline)
        return {
            "clean": all(outcome.clean for outcome in outcomes),
            "caught_up_after_s": catch_up_s,
            "seconds": round(time.monotonic() - began, 1),
            "views": [
                {"table": o.table, "sink": o.sink, "source_rows": o.source_rows, "sink_rows": o.sink_rows,
                 "divergences": {d.kind: d.count for d in o.divergences}}
                for o in outcomes
            ],
        }


def knobs(settings: StackSettings, pipeline: PipelineConfig) -> dict[str, Any]:
    """The tuning settings in force, so a result says what it was measured with."""
    from spark_jobs.settings import JobSettings

    jobs = driver.job_settings(settings)
    env_only = JobSettings()  # settings the driver reads straight from TIDE_JOB_* (not set by the stack)
    return {
        "job_trigger_interval": jobs.trigger_interval,
        "job_warehouse_trigger_interval": env_only.warehouse_trigger_interval,
        "job_analytics_trigger_interval": env_only.analytics_trigger_interval,
        "job_max_offsets_per_trigger": jobs.max_offsets_per_trigger,
        "job_driver_memory": jobs.driver_memory,
        "job_es_bulk_size": env_only.es_bulk_size,
        "source_partitions": pipeline.source.partitions,
        "kafka_heap": settings.kafka_heap,
        "connect_heap": settings.connect_heap,
        "elasticsearch_heap": settings.elasticsearch_heap,
    }


def result_dir(root: Path, scenario: str, day: datetime | None = None) -> Path:
    """bench/results/<date>-<scenario>/ (a second run the same day replaces the first)."""
    return root / f"{(day or datetime.now(timezone.utc)):%Y-%m-%d}-{scenario}"


def write_result(out_dir: Path, result: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "result.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=False, default=str) + "\n")
    return path


def read_result(out_dir: Path) -> dict[str, Any]:
    return json.loads((out_dir / "result.json").read_text())


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
    started_at = datetime.now(timezone.utc)
    say("measuring the machine's load before the run")
    result: dict[str, Any] = {
        "scenario": scenario.NAME,
        "started_at": started_at.isoformat(timespec="seconds"),
        "options": options,
        "machine": measure.machine(),
        "versions": pinned().model_dump(),
        "knobs": knobs(settings, pipeline),
        "load_before": {"loadavg": measure.loadavg(), "busiest_processes": measure.busiest_processes()},
    }
    try:
        with sampled(bench) as sampler:
            result["results"] = scenario.run(bench)
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

