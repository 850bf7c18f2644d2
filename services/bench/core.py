"""What every scenario shares: its own clean stack, pausing and resuming its stages, the sinks'
progress, verify.

A scenario is a module with `NAME`, `run(bench) -> dict` (its measurements),
`plot(result, out_dir) -> list[Path]` (PNG files drawn from the JSON result alone,
so plots can be redrawn from a committed result) and optionally `check(bench, results)`
(instead of `Bench.verify`); services/bench/runs.py runs one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import psycopg

from services.bench import measure
from services.jobs import driver, lag
from services.settings import StackSettings
from services.stack import postgres, process, runner
from services.stack.members import members
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import SINKS, JobSettings, SinkName
from spark_jobs.runtime.checkpoints import Offsets

T = TypeVar("T")
# Records/s a sink is assumed to apply when the run did not measure it: below every rate measured here
# so far (the warehouse's ~150/s included, docs/benchmarks.md), so the wait errs long.
DEFAULT_APPLY_RATE = 100.0
CAPTURE_SERVICES = ["postgres", "kafka", "connect"]  # a capture-only run: no Spark, no sinks' stores
STALL_S = 600.0  # a Delta micro-batch took up to 450 s on the loaded machine
# Connector settings that shape the capture stage's speed (docs/benchmarks.md, Capture settings).
CAPTURE_KNOBS = ("max.batch.size", "max.queue.size", "poll.interval.ms", "snapshot.fetch.size",
                 "producer.override.linger.ms", "producer.override.batch.size", "producer.override.compression.type",
                 "key.converter.schemas.enable", "value.converter.schemas.enable")
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


def running_sinks() -> tuple[SinkName, ...]:
    """The sinks whose queries the driver runs: all of them, or those named by TIDE_JOB_SINKS (which
    the driver reads from the environment), so a run can measure some sinks without the others."""
    chosen = JobSettings().sinks
    return tuple(sink for sink in SINKS if sink in chosen)


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
    sinks: tuple[SinkName, ...] = field(default_factory=running_sinks)
    began: float = field(default_factory=time.monotonic)
    load_during: list[list[float]] = field(default_factory=list)
    others_during: list[dict[str, Any]] = field(default_factory=list)
    _consumer: Any = None  # one Kafka consumer for the run's many end-offset reads (not thread-safe: locked)
    _kafka_lock: threading.Lock = field(default_factory=threading.Lock)

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
        from services.db import migrate  # SQLAlchemy and Alembic only when a bench runs

        self.down()
        process.purge(self.settings.state_dir)
        self.say(f"starting a clean stack in {self.settings.state_dir}")
        runner.up(self.settings, services, report=lambda name, state: self.say(f"  {name}: {state}"))
        migrate.upgrade(self.settings, pipeline=self.pipeline)

    def seed_demo(self) -> None:
        """A starting data set for the demo workload (larger than the default, so picks spread out)."""
        import random

        from services.demo import workload

        with self.connect() as conn:
            workload.seed(conn, random.Random(self.options.get("seed", 1)), customers=500, products=100, orders=500)

    def capture_and_apply(self) -> None:
        """Register the connector (initial snapshot, then streaming) and start the Spark jobs."""
        self.capture()
        self.apply()

    def capture(self) -> None:
        """Register the connector, with the run's `--connector` overrides (recorded in its knobs)."""
        from services.capture.connector import registration

        # also creates every change topic first
        registration.apply(self.settings, self.pipeline, overrides=self.options.get("connector") or None)
        self.say("connector running")

    def apply(self) -> None:
        """Start the Spark jobs and wait until every query runs."""
        self.say("starting the apply jobs")
        runner.start_and_wait(self.settings, [driver.SERVICE],
                              report=lambda name, state: self.say(f"  {name}: {state}"))

    def pause_connector(self, paused: bool) -> None:
        """Pause (the slot then holds every change) or resume the connector's task; waits for the state."""
        from services.capture.connector.connect_api import ConnectApi
        from services.stack import kafka

        name, wanted = self.pipeline.source.connector, "PAUSED" if paused else "RUNNING"
        with ConnectApi(kafka.connect_url(self.settings)) as api:
            api.pause(name) if paused else api.resume(name)
            poll_until(lambda: all(task["state"] == wanted for task in (api.status(name) or {}).get("tasks", [{}])),
                       60, f"the connector's task to be {wanted}", 0.2)

    def pause_queries(self, paused: bool) -> None:
        """Pause every sink's query (`tide jobs pause`) or resume them all; waits until the driver
        reports them stopped (pausing). Resuming returns at once: each query restarts within seconds."""
        from spark_jobs.runtime import control

        control.write_paused(driver.paused_file(self.settings), set(self.sinks) if paused else set())
        if paused:
            poll_until(lambda: (status := driver.read_status(self.settings)) and all(
                query.get("paused") and not query["active"] for query in status["queries"].values()),
                60, "the driver to stop every query", 0.5)

    def down(self) -> None:
        with self._kafka_lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
        process.stop(runner.pid_file(self.settings, driver.SERVICE))
        runner.down(self.settings)

    def require_jobs(self) -> None:
        """BenchError if the jobs driver is gone (nothing restarts it): waiting for the sinks is then pointless."""
        if process.running(runner.pid_file(self.settings, driver.SERVICE)) is None:
            raise BenchError(
                f"the jobs driver is not running; its log: {runner.log_file(self.settings, driver.SERVICE)}")

    def component_pids(self) -> dict[str, int]:
        """Root pid of each running component (the sampler adds their descendants), and this process."""
        pids = {"bench (load, probes, verify)": os.getpid()}
        for service in [*members(self.settings).values(), driver.SERVICE]:
            if started := process.running(runner.pid_file(self.settings, service)):
                pids[service.name] = started.pid
        return pids

    # ---- the sinks -------------------------------------------------------------------------------

    def topics(self, sink: str | None = None) -> list[str]:
        tables = self.pipeline.sink_tables(sink) if sink else list(self.pipeline.tables)
        return [self.pipeline.topic(table) for table in tables]

    def end_offsets(self) -> dict[str, dict[int, int]]:
        """Every change topic's end offsets now."""
        from kafka import KafkaConsumer

        with self._kafka_lock:
            if self._consumer is None:
                self._consumer = KafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap)
            return lag.end_offsets(self.settings, self.topics(), consumer=self._consumer)

    def progress(self, sinks: tuple[SinkName, ...] | None = None) -> dict[str, int]:
        """Records in the change topics (`captured`) and, per sink (default: the run's), records its
        query has applied (`positions`)."""
        ends = self.end_offsets()
        counts = {"captured": sum(offset for parts in ends.values() for offset in parts.values())}
        sinks = self.sinks if sinks is None else sinks
        for sink, committed in self.positions(sinks).items():
            mine = {topic: parts for topic, parts in ends.items() if topic in self.topics(sink)}
            counts[sink] = sum(
                min(committed.get(topic, {}).get(part, 0), end)
                for topic, parts in mine.items() for part, end in parts.items()
            )
        return counts

    def behind(self) -> dict[str, int]:
        """Records each sink has not yet applied (`positions`), against the topics' end offsets now; for a
        sink with a follow-up query (search's nested views in Real-Time Mode), its records too: the sink
        has not applied a change until that query has."""
        ends = self.end_offsets()
        behind = {
            sink: lag.records_behind(applied, {topic: ends.get(topic, {}) for topic in self.topics(sink)})
            for sink, applied in self.positions(self.sinks).items()
        }
        for sink in self.follow_up_topics:
            behind[sink] += self.follow_up_behind(sink)
        return behind

    def follow_up_behind(self, sink: SinkName) -> int:
        """Records of `sink`'s follow-up topic (one of `follow_up_topics`) its follow-up query has not applied."""
        with self._kafka_lock:
            return lag.follow_up_behind(self.settings, driver.job_settings(self.settings), sink,
                                        self.follow_up_topics[sink], consumer=self._consumer)

    def positions(self, sinks: tuple[SinkName, ...]) -> dict[str, Offsets]:
        """Per sink, what its query has applied: its checkpoint's offsets or, further, what a real-time
        query's writers published as applied since its last epoch (as `tide status` reads it)."""
        return lag.sink_positions(self.settings, sinks)

    @cached_property
    def realtime_sinks(self) -> list[SinkName]:
        return driver.job_settings(self.settings).realtime_sinks

    @cached_property
    def follow_up_topics(self) -> dict[SinkName, str]:
        """The run's real-time sinks' follow-up topics (`Sink.follow_up_topic`, spark_jobs/realtime.py):
        search's, with nested views."""
        jobs = driver.job_settings(self.settings)
        return {sink: topic for sink in self.sinks
                if sink in self.realtime_sinks and (topic := lag.follow_up_topic(jobs, self.pipeline, sink))}

    def wait_caught_up(self, timeout_s: float, stall_s: float | None = None) -> float:
        """Wait until every sink has committed everything in its topics; returns the seconds waited.
        BenchError after `timeout_s`, or once no sink has gained for `stall_s`. Says every 30 s how
        far behind each sink is."""
        began = last_gain = last_said = time.monotonic()
        lowest = behind = self.behind()
        while any(behind.values()):
            now = time.monotonic()
            if any(behind[sink] < lowest[sink] for sink in behind):
                last_gain, lowest = now, {sink: min(lowest[sink], behind[sink]) for sink in behind}
            self.require_jobs()
            stalled = stall_s is not None and now - last_gain > stall_s
            if now - began > timeout_s or stalled:
                why = f"no sink gained for {now - last_gain:.0f}s" if stalled else f"gave up after {now - began:.0f}s"
                raise BenchError(f"{why} waiting for every sink to catch up; records behind: {behind}")
            if now - last_said >= 30:
                last_said = now
                self.say("  records behind: " + ", ".join(f"{sink} {count:,}" for sink, count in behind.items()))
            time.sleep(2.0)  # poll: the queries commit on their own schedule
            behind = self.behind()
        return round(time.monotonic() - began, 1)

    def components_between(self, began: float, ended: float) -> dict[str, dict[str, float]]:
        """Each component's mean and peak CPU and peak memory between two times of `now()` (the
        sampler keeps its own clock, started a moment later)."""
        if self.sampler is None:
            return {}
        shift = self.sampler.began - self.began
        return self.sampler.summary(began - shift, ended - shift)

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

    def verify(self, rates: dict[str, float] | None = None) -> dict[str, Any]:
        """`tide verify` over every view, once every sink has caught up: a fast wrong answer is not a
        result. The wait scales with what each sink still has to apply at the `rates` this run measured
        (records/s; catch_up_budget), and ends early when no sink gains for 10 minutes."""
        from services.verify import reconcile_views

        behind = self.behind()
        budget = catch_up_budget(behind, rates or {})
        if any(behind.values()):
            self.say(f"waiting up to {budget:.0f}s for the sinks to apply what they still have: {behind}")
        try:
            catch_up_s: float | str = self.wait_caught_up(budget, stall_s=STALL_S)
        except BenchError as exc:
            catch_up_s = str(exc)  # verify anyway: the divergences then say what is missing
        began = time.monotonic()
        self.say("verifying every view against PostgreSQL")
        outcomes = reconcile_views(self.settings, sinks=self.sinks, pipeline=self.pipeline)
        return {
            "clean": all(outcome.clean for outcome in outcomes),
            "behind_before_catch_up": behind,
            "catch_up_budget_s": budget,
            "caught_up_after_s": catch_up_s,
            "seconds": round(time.monotonic() - began, 1),
            "views": [
                {"table": o.table, "sink": o.sink, "source_rows": o.source_rows, "sink_rows": o.sink_rows,
                 "divergences": {d.kind: d.count for d in o.divergences}}
                for o in outcomes
            ],
        }


def catch_up_budget(behind: dict[str, int], rates: dict[str, float], floor_s: float = 300.0, slack: float = 2.0,
                    cap_s: float = 4 * 3600.0) -> float:
    """Seconds to wait for the sinks to apply what they are `behind`: the slowest sink's backlog at
    its measured rate (records/s; DEFAULT_APPLY_RATE where unmeasured), times `slack`, at least
    `floor_s` and at most `cap_s`."""
    needed = [count / (rates.get(sink) or DEFAULT_APPLY_RATE) for sink, count in behind.items() if count > 0]
    return round(min(cap_s, max([floor_s, *(slack * seconds for seconds in needed)])), 1)
