"""One chaos run: a pipeline of its own on the running stack, writers, seeded faults, convergence,
`tide verify` twice, and the verdict (docs/reliability.md, "Chaos runner").

The run has its own connector, slot, publication, topics, index names, Redis database, warehouse
and checkpoints (under `work_dir`), and its own driver, so it never touches the pipeline of
`tide up`. The stack's services themselves are what the faults kill: run it on a stack you can
afford to disturb.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis
import yaml

from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectApi
from services.chaos import cluster_faults, faults, ledger, observe
from services.chaos.profiles import CLUSTER_FAULTS, Profile, schedule
from services.db import migrate
from services.demo import workload
from services.jobs import driver, lag
from services.settings import StackSettings
from services.stack import kafka, postgres, process, runner
from services.stack.rows import scalar
from services.verify import Divergence, reconcile_views
from spark_jobs.model.config import PipelineConfig, TableConfig, load
from spark_jobs.model.settings import SINKS
from spark_jobs.model.sink_registry import spec_of

REDIS_DB = 9  # the chaos run's Redis database (flushed at the start of a run)
Say = Callable[[str], None]


@dataclass
class Injected:
    fault: str
    at_s: float  # seconds after the writers started
    detail: str


@dataclass
class Report:
    profile: str
    seed: int
    started_at: str
    duration_s: float = 0.0
    injected: list[Injected] = field(default_factory=list)
    committed: int = 0  # writer transactions committed
    rolled_back: int = 0  # writer transactions rolled back (conflicts between writers)
    duplicates: int = 0
    replays: list[observe.Replay] = field(default_factory=list)
    ledgers: list[ledger.LedgerState] = field(default_factory=list)
    verify_passes: list[list[Divergence]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def judge(self, profile: Profile) -> None:
        """The verdict: a clean verify twice, complete ledgers, and proof the faults did something: a
        duplicate delivery when the profile kills Connect or Kafka, a replayed micro-batch when it kills
        the driver (a killed Spark worker's or Kafka broker's fault proves its own: cluster_faults.py)."""
        for number, divergences in enumerate(self.verify_passes, start=1):
            if divergences:
                self.failures.append(f"verify pass {number}: {len(divergences)} divergences, e.g. {divergences[:5]}")
        for state in self.ledgers:
            self.failures += state.problems
        if self.duplicates < 1 and {"connect", "kafka"} & set(profile.faults):
            self.failures.append("invalid run: no duplicate delivery observed (the faults did not bite)")
        if not self.replays and "driver" in profile.faults:
            self.failures.append("invalid run: no replayed micro-batch observed (the faults did not bite)")


def chaos_pipeline(base: PipelineConfig, writers: int, bulk: bool, label: str, demo: bool = True,
                   partitions: int | None = None) -> PipelineConfig:
    """The demo tables (unless not `demo`) plus the writers' ledgers (and chaos_bulk) in every sink, under
    names of the run's own, on topics of `partitions` partitions (None: the base pipeline's)."""
    # Every view a sink declares, each with its defaults (a derived sink has none: no history on a ledger,
    # unless the demo tables are left out: then the ledgers' history is what the analytics query applies).
    views: dict[str, dict] = {view: {} for sink in SINKS if (view := spec_of(sink).view)}
    ledger_views = TableConfig.model_validate(views if demo else {**views, "warehouse": {"history": True}})
    extra = [ledger.ledger_table(n) for n in range(1, writers + 1)] + (["chaos_bulk"] if bulk else [])
    tables = {
        name: views.model_copy(update={
            "search": views.search and views.search.model_copy(update={"index": f"{label}_{name}"})})
        for name, views in {**(base.tables if demo else {}), **dict.fromkeys(extra, ledger_views)}.items()
    }
    if not demo:  # the views built from the demo tables go with them
        base = base.model_copy(update={"nested": {}, "windows": {}, "cache_aggregates": {}})
    source = base.source.model_copy(update={
        "connector": f"chaos-{label}", "slot": f"chaos_{label}", "topic_prefix": f"chaos{label}",
        "publication": "tideline_chaos", "partitions": partitions or base.source.partitions,
    })  # fmt: skip
    nested = {f"{label}_{name}_nested": view for name, view in base.nested.items()}
    chaos = base.model_copy(update={"source": source, "tables": tables, "nested": nested})
    return PipelineConfig.model_validate(chaos.model_dump(by_alias=True))  # the checks the driver makes at start


def prepare(stack: StackSettings, profile: Profile, seed: int, work_dir: Path) -> tuple[StackSettings, PipelineConfig]:
    """Migrate, reset the ledgers, load the bulk rows and seed the demo data; the run's own settings."""
    if unmet := profile.unmet(stack.spark_workers, stack.kafka_brokers):
        raise faults.ChaosError(f"the {profile.name} profile's faults need the cluster profile: set "
                                f"{' and '.join(unmet)}; docs/cluster.md")
    runner.up(stack)  # every service healthy before the first fault (idempotent: running ones are left alone)
    migrate.upgrade(stack)
    label = f"{profile.name}{seed % 10_000}x{uuid.uuid4().hex[:4]}"
    pipeline = chaos_pipeline(load(stack.pipeline_file), profile.writers, profile.snapshot_rows > 0, label,
                              profile.demo_tables, profile.partitions)
    # A replay of a seed reuses its folder: the last run's checkpoints name that run's topics.
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    (work_dir / "pipeline.yaml").write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, mode="json")))
    jobs = stack.model_copy(update={
        "state_dir": work_dir, "pipeline_file": work_dir / "pipeline.yaml", "job_redis_db": REDIS_DB,
        "job_trigger_interval": "1 seconds",
    })  # fmt: skip
    redis.Redis(host=stack.host, port=stack.redis_port, db=REDIS_DB).flushdb()
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        ledger.empty_ledgers(conn, profile.writers)
        if scalar(conn, "SELECT count(*) FROM customers") == 0:
            workload.seed(conn, random.Random(seed))
        _load_bulk(conn, profile.snapshot_rows)
    return jobs, pipeline


def _load_bulk(conn: psycopg.Connection, rows: int) -> None:
    held = scalar(conn, "SELECT count(*) FROM chaos_bulk")
    if held != rows:
        conn.execute("TRUNCATE chaos_bulk")
        conn.execute("INSERT INTO chaos_bulk (id, payload) SELECT g, md5(g::text) FROM generate_series(1, %s) g",
                     (rows,))


def run(stack: StackSettings, profile: Profile, seed: int, work_dir: Path, say: Say = print) -> Report:
    """The whole run; the report says what happened and why it failed, if it did."""
    began = time.monotonic()
    report = Report(profile.name, seed, time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    say(f"chaos run: profile {profile.name}, seed {seed} "
        f"(replay with `tide chaos --profile {profile.name} --seed {seed}`)")
    jobs, pipeline = prepare(stack, profile, seed, work_dir)
    watch = observe.ReplayWatch(jobs.state_dir / "checkpoints")
    target = faults.Target(stack, jobs, pipeline, watch)
    writers = [
        ledger.LedgerWriter(postgres.conninfo(stack), n, seed * 100 + n, profile.writer_pause_s)
        for n in range(1, profile.writers + 1)
    ]
    try:
        # Writers first, so the snapshot (1M rows in the full profile) is taken under load.
        for writer in writers:
            writer.start()
        registration.apply(stack, pipeline, wait_s=120)
        runner.start_and_wait(jobs, [driver.SERVICE])
        watch.start()
        say(f"pipeline {pipeline.source.connector} applying; {profile.writers} writers for {profile.write_s:.0f}s")
        _inject(target, profile, seed, writers, report, say)
        for writer in writers:
            writer.finish()
        report.committed = sum(w.committed for w in writers)
        report.rolled_back = sum(w.rolled_back for w in writers)
        say(f"writers stopped: {report.committed} transactions committed, {report.rolled_back} rolled back")
        _converge(stack, jobs, pipeline, profile.converge_s, say)
        with psycopg.connect(postgres.conninfo(stack)) as conn:
            report.ledgers = [ledger.ledger_state(conn, writer) for writer in writers]
        _verify_twice(jobs, pipeline, profile.verify_gap_s, report, say)
        _explain(stack, pipeline, report.verify_passes[-1], target.injected, say)
        watch.check()
        report.replays = list(watch.replays)
        report.duplicates = sum(
            observe.duplicate_deliveries(observe.read_to_end(stack, pipeline.topic(table)), target.injected)
            for table in pipeline.tables
        )
        say(f"observed: {report.duplicates} duplicate deliveries, {len(report.replays)} replayed micro-batches "
            f"({', '.join(f'{r.sink} {r.batch}' for r in report.replays) or 'none'})")
        report.judge(profile)
    except faults.ChaosError as exc:
        report.failures.append(str(exc))
    finally:
        for writer in writers:
            writer.stop.set()
        watch.stop.set()
        _tear_down(stack, jobs, pipeline)
        report.duration_s = round(time.monotonic() - began)
    return report


def _inject(target: faults.Target, profile: Profile, seed: int, writers: list[ledger.LedgerWriter],
            report: Report, say: Say) -> None:
    """Each planned fault at its time (or as soon as the previous one is over), while the writers write."""
    started = time.monotonic()
    for planned in schedule(profile, seed):
        _sleep_until(started + planned.at_s, writers)
        at = round(time.monotonic() - started, 1)
        inject = (cluster_faults.injector(planned.fault) if planned.fault in CLUSTER_FAULTS
                  else faults.injector(planned.fault, profile.pause_s, profile.stale_keys))
        detail = inject(target, random.Random(planned.draw))
        report.injected.append(Injected(planned.fault, at, detail))
        say(f"  {at:7.1f}s {planned.fault}: {detail}")
    _sleep_until(started + profile.write_s, writers)


def _sleep_until(moment: float, writers: list[ledger.LedgerWriter]) -> None:
    while time.monotonic() < moment:
        failed = [w for w in writers if w.error is not None]
        if failed:
            raise faults.ChaosError(f"{failed[0].name} failed: {failed[0].error!r}")
        time.sleep(min(1.0, max(0.0, moment - time.monotonic())))  # the writers' time between faults


def _converge(stack: StackSettings, jobs: StackSettings, pipeline: PipelineConfig, timeout_s: float, say: Say) -> None:
    """Every commit captured (the slot confirmed past the last write), then every sink past the end
    of its topics as they are then; ChaosError at the deadline."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        written = scalar(conn, "SELECT pg_current_wal_lsn()")
    slot = pipeline.source.slot

    def captured() -> bool:
        with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (written, slot)).fetchone()
        return bool(row and row[0])

    _wait(captured, deadline, f"slot {slot} to confirm every write (connector: {_connector_state(stack, pipeline)})")
    ends: dict[str, dict[str, dict[int, int]]] = {
        sink: lag.end_offsets(stack, [pipeline.topic(t) for t in pipeline.sink_tables(sink)]) for sink in SINKS}

    caught_at: dict[str, float] = {}  # each sink's catch-up, seconds after the writers stopped

    def behind() -> dict[str, int]:
        found = {sink: lag.records_behind(applied, ends[sink])
                 for sink, applied in lag.sink_positions(jobs, SINKS).items()}
        for sink in (sink for sink, records in found.items() if not records):
            caught_at.setdefault(sink, timeout_s - (deadline - time.monotonic()))
        return found

    _wait(lambda: not any(behind().values()), deadline, f"every sink to catch up (records behind: {behind()})")
    each = ", ".join(f"{sink} {at:.0f}s" for sink, at in caught_at.items())
    say(f"converged: capture and every sink caught up, {timeout_s - (deadline - time.monotonic()):.0f}s after the "
        f"writers stopped ({each})")


def _wait(predicate: Callable[[], bool], deadline: float, what: str) -> None:
    while True:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - a store still recovering from the last fault: ask again
            pass
        if time.monotonic() > deadline:
            raise faults.ChaosError(f"no convergence: gave up waiting for {what}")
        time.sleep(2.0)  # poll: the state lives in other processes


def _connector_state(stack: StackSettings, pipeline: PipelineConfig) -> str:
    try:
        with ConnectApi(kafka.connect_url(stack)) as api:
            status = api.status(pipeline.source.connector) or {}
    except Exception as exc:  # noqa: BLE001 - only for the message
        return f"unknown ({exc})"
    tasks = ", ".join(task.get("state", "?") for task in status.get("tasks", []))
    return f"{status.get('connector', {}).get('state', 'absent')}, tasks {tasks or 'none'}"


def _verify_twice(jobs: StackSettings, pipeline: PipelineConfig, gap_s: float, report: Report, say: Say) -> None:
    for number in (1, 2):
        if number == 2:
            time.sleep(gap_s)  # the 30 s: a view that drifts after converging shows now
        outcomes = reconcile_views(jobs, pipeline=pipeline)
        divergences = [d for outcome in outcomes for d in outcome.divergences]
        report.verify_passes.append(divergences)
        say(f"verify pass {number}: {len(outcomes)} views, {len(divergences)} divergences")


def _explain(stack: StackSettings, pipeline: PipelineConfig, divergences: list, injected: set, say: Say) -> None:
    """Print the change records of a few diverging rows: did Debezium send the row's last change?"""
    wanted: dict[str, set[str]] = {}
    for divergence in divergences:
        if divergence.table in pipeline.tables:
            wanted.setdefault(divergence.table, set()).update(divergence.examples[:3])
    for table, ids in wanted.items():
        history = observe.key_history(observe.read_to_end(stack, pipeline.topic(table)), ids, injected)
        for row in sorted(ids):
            say(f"change records of {table} {row}:")
            for line in history.get(row, ["none"]):
                say(f"    {line}")


def _tear_down(stack: StackSettings, jobs: StackSettings, pipeline: PipelineConfig) -> None:
    """Stop the run's driver, remove its connector and slot (the stack itself keeps running)."""
    process.stop(runner.pid_file(jobs, driver.SERVICE))
    with contextlib.suppress(Exception):  # a stack broken by the run: the report already says why
        registration.delete(stack, pipeline, drop_slot=True)
